//! Writing the patch as the admission response carries it: JSON text and its base64 at once.
//!
//! Most of a patch is the same bytes on every request (the rendered items of a cached rendering),
//! so their base64 is computed once, next to their JSON, and a request copies both. Base64 of a
//! concatenation equals the concatenation of the parts' base64 only at multiples of 3 bytes, so
//! a constant fragment is stored padded with trailing spaces to such a length, and the writer pads
//! the text before it with spaces to a multiple of 3 as well. Both paddings fall between JSON
//! tokens (a fragment is a whole JSON value), where whitespace does not change the document.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// The two base64 characters of every 12-bit value, so that 3 input bytes take two lookups.
static PAIRS: [u16; 4096] = pairs();

const fn pairs() -> [u16; 4096] {
    let mut t = [0u16; 4096];
    let mut i = 0;
    while i < 4096 {
        t[i] = ((ALPHABET[i >> 6] as u16) << 8) | ALPHABET[i & 63] as u16;
        i += 1;
    }
    t
}

fn pair(v: u64) -> u64 {
    // The index is masked to 12 bits, so the lookup is always in bounds.
    u64::from(PAIRS[(v & 0xfff) as usize])
}

/// Appends the standard (padded) base64 of `input` to `out`.
pub(crate) fn encode_into(input: &[u8], out: &mut Vec<u8>) {
    // 6 bytes to 8 characters per step, reading 8 bytes at once while 8 are left.
    let steps = input.len().saturating_sub(2) / 6;
    let start = out.len();
    out.resize(start + steps * 8, 0);
    if let Some(dst) = out.get_mut(start..) {
        for (d, i) in dst.chunks_exact_mut(8).zip((0..).step_by(6)) {
            let Some(Ok(s)) = input.get(i..i + 8).map(<[u8; 8]>::try_from) else {
                break;
            };
            let n = u64::from_be_bytes(s);
            let w = (pair(n >> 52) << 48)
                | (pair(n >> 40) << 32)
                | (pair(n >> 28) << 16)
                | pair(n >> 16);
            d.copy_from_slice(&w.to_be_bytes());
        }
    }
    match *input.get(steps * 6..).unwrap_or_default() {
        [] => {}
        [a] => {
            let w = pair(u64::from(a) << 4);
            out.extend_from_slice(&[(w >> 8) as u8, w as u8, b'=', b'=']);
        }
        [a, b] => {
            let n = (u64::from(a) << 16) | (u64::from(b) << 8);
            let hi = pair(n >> 12);
            out.extend_from_slice(&[
                (hi >> 8) as u8,
                hi as u8,
                ALPHABET[((n >> 6) & 63) as usize],
                b'=',
            ]);
        }
        [a, b, c, ref tail @ ..] => {
            let n = (u64::from(a) << 16) | (u64::from(b) << 8) | u64::from(c);
            let w = (pair(n >> 12) << 16) | pair(n);
            out.extend_from_slice(&(w as u32).to_be_bytes());
            encode_into(tail, out);
        }
    }
}

/// A constant JSON value with its base64, computed once and copied into many patches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Fragment {
    /// The JSON text, followed by up to two spaces so that its length is a multiple of 3.
    json: String,
    /// Base64 of `json`, without `=` padding (there is none at a multiple of 3).
    b64: String,
}

impl Fragment {
    pub fn new(json: &str) -> Fragment {
        let mut padded = String::with_capacity(json.len() + 2);
        padded.push_str(json);
        while !padded.len().is_multiple_of(3) {
            padded.push(' ');
        }
        let mut b64 = Vec::with_capacity(padded.len() / 3 * 4);
        encode_into(padded.as_bytes(), &mut b64);
        Fragment {
            json: padded,
            // Base64 output is ASCII.
            b64: String::from_utf8(b64).unwrap_or_default(),
        }
    }

    /// The JSON text (with its padding spaces).
    #[cfg(test)]
    pub fn json(&self) -> &str {
        &self.json
    }

    #[cfg(test)]
    pub fn b64(&self) -> &str {
        &self.b64
    }

    /// The length of the JSON text (with its padding spaces).
    pub fn json_len(&self) -> usize {
        self.json.len()
    }
}

/// JSON text being written, with the base64 of everything up to the last fragment already done.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    json: Vec<u8>,
    b64: Vec<u8>,
    /// `json[..encoded]` is in `b64`; always a multiple of 3.
    encoded: usize,
}

impl Writer {
    pub fn with_capacity(json: usize) -> Writer {
        Writer {
            json: Vec::with_capacity(json),
            b64: Vec::with_capacity(json.div_ceil(3) * 4 + 8),
            encoded: 0,
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

    /// Writes a constant JSON value. Call it only where a JSON value may start: the spaces it may
    /// write first must fall between two tokens.
    pub fn fragment(&mut self, f: &Fragment) {
        while !self.json.len().is_multiple_of(3) {
            self.json.push(b' ');
        }
        self.flush();
        self.json.extend_from_slice(f.json.as_bytes());
        self.b64.extend_from_slice(f.b64.as_bytes());
        self.encoded = self.json.len();
    }

    fn flush(&mut self) {
        let whole = self.json.len() / 3 * 3;
        if let Some(pending) = self.json.get(self.encoded..whole) {
            encode_into(pending, &mut self.b64);
        }
        self.encoded = whole;
    }

    /// The JSON text and its standard base64.
    pub fn finish(mut self) -> (Vec<u8>, Vec<u8>) {
        self.flush();
        if let Some(rest) = self.json.get(self.encoded..) {
            encode_into(rest, &mut self.b64);
        }
        (self.json, self.b64)
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

    #[test]
    fn a_fragment_is_padded_to_a_multiple_of_three_and_still_decodes_to_its_json() {
        for json in ["{}", "[1]", "\"abcd\"", "{\"a\":1}"] {
            let f = Fragment::new(json);
            assert_eq!(f.json().len() % 3, 0);
            assert_eq!(f.json().trim_end(), json);
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(f.b64())
                .unwrap();
            assert_eq!(decoded, f.json().as_bytes());
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

        /// Text and fragments in any order: the base64 is that of the text, and the text is the
        /// same JSON as without the padding.
        #[test]
        fn mixed_text_and_fragments_give_the_base64_of_the_text(
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
                    w.fragment(&Fragment::new(&json));
                } else {
                    w.string(s);
                }
                plain.extend_from_slice(json.as_bytes());
            }
            w.byte(b']');
            plain.push(b']');
            let (json, b64) = w.finish();
            prop_assert_eq!(std::str::from_utf8(&b64).unwrap(), reference(&json));
            let ours: serde_json::Value = serde_json::from_slice(&json).unwrap();
            let theirs: serde_json::Value = serde_json::from_slice(&plain).unwrap();
            prop_assert_eq!(ours, theirs);
        }
    }
}
