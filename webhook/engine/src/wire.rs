//! Writing a patch as JSON text: most of a patch is the same bytes on every request (the rendered
//! items of a cached rendering), kept as JSON text and copied.

use splice_json::{push_json_body, push_json_str};

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

    /// The JSON text.
    pub fn finish(self) -> Vec<u8> {
        self.json
    }
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Text and fragments in any order: the text is the JSON written piece by piece.
        #[test]
        fn mixed_text_and_fragments_give_the_json_written_piece_by_piece(
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
            prop_assert_eq!(w.finish(), plain);
        }
    }
}
