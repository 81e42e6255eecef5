//! Writing the patch as the admission response carries it: JSON text, then its base64.
//!
//! Most of a patch is the same bytes on every request (the rendered items of a cached rendering),
//! kept as JSON text and copied. The base64 is taken once over the finished text: with SIMD it
//! costs less than the earlier scheme of base64 computed once per cached item and copied (which
//! needed every piece padded to a multiple of 3 bytes), 87.3k against 88.9k instructions for an
//! 8.5 KB injection (callgrind, both with base64-simd).

/// Appends the standard (padded) base64 of `input` to `out`. base64-simd picks SSSE3, AVX2 or
/// NEON code at run time; the portable table encoder it replaced spent 7.2k of the 92.6k
/// instructions of an 8.5 KB injection on the 1.2 KB of patch text that was not cached.
pub(crate) fn encode_into(input: &[u8], out: &mut Vec<u8>) {
    base64_simd::STANDARD.encode_append(input, out);
}

/// A constant JSON value, serialized once and copied into many patches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fragment(String);

impl Fragment {
    /// `json` must be one whole JSON value.
    pub fn new(json: String) -> Fragment {
        Fragment(json)
    }

    /// The length of the JSON text.
    pub fn json_len(&self) -> usize {
        self.0.len()
    }
}

/// A patch being written as JSON text.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    json: Vec<u8>,
}

impl Writer {
    pub fn with_capacity(json: usize) -> Writer {
        Writer {
            json: Vec::with_capacity(json),
        }
    }

    pub fn bytes(&mut self, s: &[u8]) {
        self.json.extend_from_slice(s);
    }

    pub fn byte(&mut self, b: u8) {
        self.json.push(b);
    }

    /// Writes `s` as a JSON string, escaped as serde_json escapes it.
    pub fn string(&mut self, s: &str) {
        push_json_str(&mut self.json, s);
    }

    /// Writes `s` escaped for a JSON string, without quotes.
    pub fn string_body(&mut self, s: &str) {
        push_json_body(&mut self.json, s);
    }

    /// Writes `n` in decimal.
    pub fn decimal(&mut self, n: usize) {
        push_decimal(&mut self.json, n);
    }

    /// Writes `v` as serde_json writes it.
    pub fn value(&mut self, v: &serde_json::Value) -> Result<(), serde_json::Error> {
        serde_json::to_writer(&mut self.json, v)
    }

    /// Writes a constant JSON value where a value may start.
    pub fn fragment(&mut self, f: &Fragment) {
        self.json.extend_from_slice(f.0.as_bytes());
    }

    /// The JSON text and its standard base64.
    pub fn finish(self) -> (Vec<u8>, Vec<u8>) {
        let mut b64 = Vec::with_capacity(self.json.len().div_ceil(3) * 4);
        encode_into(&self.json, &mut b64);
        (self.json, b64)
    }
}

/// The index of the first byte JSON strings must escape (`"`, `\` or a control character): the
/// JSON reader's string scan finds exactly those. The writer calls this one out-of-line copy of
/// it: with the scan inlined into each of its callers instead, the 8.5 KB injection took 0.9k more
/// instructions (callgrind, 93.4k against 92.5k).
pub(crate) fn first_escape(s: &[u8]) -> Option<usize> {
    crate::json::string_stop(s)
}

/// Appends `n` in decimal.
pub(crate) fn push_decimal(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[at..]);
}

/// Appends `s` as a JSON string, escaped as serde_json escapes it.
pub(crate) fn push_json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    push_json_body(out, s);
    out.push(b'"');
}

/// Appends `s` escaped as serde_json escapes a string, without the quotes.
pub(crate) fn push_json_body(out: &mut Vec<u8>, s: &str) {
    let mut rest = s.as_bytes();
    while let Some(i) = first_escape(rest) {
        let (plain, tail) = rest.split_at(i);
        out.extend_from_slice(plain);
        let Some((&b, tail)) = tail.split_first() else {
            break;
        };
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
        rest = tail;
    }
    out.extend_from_slice(rest);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use base64::Engine as _;
    use proptest::prelude::*;

    use super::*;

    fn reference(input: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(input)
    }

    #[test]
    fn short_inputs_encode_as_the_base64_crate_encodes_them() {
        for len in 0..40 {
            let input: Vec<u8> = (0..len).map(|i| (i * 37 + 11) as u8).collect();
            let mut ours = Vec::new();
            encode_into(&input, &mut ours);
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                reference(&input),
                "len {len}"
            );
        }
    }

    #[test]
    fn strings_are_escaped_as_serde_escapes_them() {
        for s in [
            "",
            "plain",
            "a\"b",
            "back\\slash",
            "\u{0}\u{1f}\n\r\t\u{8}\u{c}",
            "über 🦀 \u{7f}",
            "0123456\"89abcdef\\",
            "01234567",
            "0123456789abcdef\n",
            "0123456789abcdef0123456789abcdef\u{1}tail of a string longer than sixteen",
        ] {
            let mut ours = Vec::new();
            push_json_str(&mut ours, s);
            assert_eq!(
                String::from_utf8(ours).unwrap(),
                serde_json::to_string(s).unwrap()
            );
        }
    }

    proptest! {
        #[test]
        fn any_input_encodes_as_the_base64_crate_encodes_it(
            input in proptest::collection::vec(any::<u8>(), 0..300),
            prefix in proptest::collection::vec(any::<u8>(), 0..3),
        ) {
            // Appending keeps what the buffer held.
            let mut ours = prefix.clone();
            encode_into(&input, &mut ours);
            prop_assert_eq!(&ours[..prefix.len()], &prefix[..]);
            prop_assert_eq!(std::str::from_utf8(&ours[prefix.len()..]).unwrap(), reference(&input));
        }

        #[test]
        fn any_string_is_escaped_as_serde_escapes_it(s in "\\PC*|[\\x00-\\x7f]{0,40}") {
            let mut ours = Vec::new();
            push_json_str(&mut ours, &s);
            prop_assert_eq!(String::from_utf8(ours).unwrap(), serde_json::to_string(&s).unwrap());
        }

        /// Text and fragments in any order: the text is the JSON written piece by piece, and the
        /// base64 is that of the text.
        #[test]
        fn mixed_text_and_fragments_give_the_json_and_its_base64(
            parts in proptest::collection::vec((any::<bool>(), "[a-z\"\\\\]{0,7}"), 0..12),
        ) {
            let mut w = Writer::with_capacity(16);
            let mut plain = Vec::new();
            w.byte(b'[');
            plain.push(b'[');
            for (i, (constant, s)) in parts.iter().enumerate() {
                if i > 0 {
                    w.byte(b',');
                    plain.push(b',');
                }
                let json = serde_json::to_string(s).unwrap();
                if *constant {
                    w.fragment(&Fragment::new(json.clone()));
                } else {
                    w.string(s);
                }
                plain.extend_from_slice(json.as_bytes());
            }
            w.byte(b']');
            plain.push(b']');
            let (json, b64) = w.finish();
            prop_assert_eq!(&json, &plain);
            prop_assert_eq!(std::str::from_utf8(&b64).unwrap(), reference(&json));
        }
    }
}
