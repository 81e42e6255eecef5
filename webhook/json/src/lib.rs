//! A zero-copy JSON cursor for the request path.
//!
//! The webhook reads a few fields of an 8 KB object and must prove the rest is JSON; serde_json
//! does both, but through visitors and a second pass (the envelope validates the object, then the
//! engine reads it again). This cursor walks the text once, field by field, and accepts exactly
//! what serde_json accepts for the same use:
//!
//! - skipping a value ([`Cursor::skip_value`], [`Cursor::raw_value`]) follows
//!   `serde::de::IgnoredAny`: escapes are checked for shape only (a lone `\ud800` passes), numbers
//!   for grammar only (`1e400` passes) and nesting has no limit (serde skips without recursion,
//!   and so does this);
//! - reading a string ([`Cursor::string`], [`Cursor::key`]) follows serde's `&str`/`String`
//!   decoding: surrogates must come in pairs.
//!
//! Errors carry a byte offset and what was expected, never input text: the body may hold secrets.
//!
//! The interface, all of it:
//!
//! - checking: [`utf8`] (bytes to text), [`validate`] (a whole document is JSON);
//! - reading: [`Cursor`] over a text: [`Cursor::document`] reads one value and checks nothing
//!   follows; [`Cursor::object`] / [`Cursor::key`] and [`Cursor::array`] / [`Cursor::item`] walk
//!   containers; [`Cursor::string`], [`Cursor::null`], [`Cursor::boolean`] read scalars (strings
//!   borrowed unless escaped); [`Cursor::flat_object`] reads an object of plain strings in one
//!   step; [`Cursor::skip_value`] and [`Cursor::raw_value`] check a value without decoding it;
//! - writing: [`push_json_str`] / [`push_json_body`] escape a string as serde_json does;
//! - errors: [`Error`] with its [`ErrorKind`] (end of input, not JSON, JSON of the wrong shape);
//! - for tests and fuzzing (feature `testkit`): [`testkit`]'s real documents and mutations.
//!
//! serde_json is not used because it is more than twice as slow for this read (measured in
//! docs/performance.md), and its derive reads a JSON array as a struct.

use std::borrow::Cow;
use std::fmt;

use wide::u8x16;

#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
#[cfg(test)]
mod tests;

/// What went wrong, by class: the admission envelope tells truncated bodies from malformed ones
/// from well-formed JSON of the wrong shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The input ended inside a value.
    Eof,
    /// The input is not JSON.
    Syntax,
    /// The input is JSON, but not of the shape the reader wanted (a wrong type, a repeated field).
    Shape,
}

/// A parse error: where, and what the cursor expected there. Boxed: the hot paths return
/// `Result`s, which stay one register wide this way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error(Box<Inner>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Inner {
    kind: ErrorKind,
    offset: usize,
    expected: &'static str,
}

impl Error {
    #[cold]
    #[inline(never)]
    fn new(kind: ErrorKind, offset: usize, expected: &'static str) -> Self {
        Error(Box::new(Inner {
            kind,
            offset,
            expected,
        }))
    }

    pub fn kind(&self) -> ErrorKind {
        self.0.kind
    }

    /// Byte offset into the input where the problem was found.
    pub fn offset(&self) -> usize {
        self.0.offset
    }

    /// What the cursor expected (or, for [`ErrorKind::Shape`], what it found wrong).
    pub fn expected(&self) -> &'static str {
        self.0.expected
    }

    /// The same error with its offset counted from `start`: an error met in a value read inside
    /// a larger text, reported against the value alone.
    pub fn relative_to(mut self, start: usize) -> Self {
        self.0.offset = self.0.offset.saturating_sub(start);
        self
    }

    pub fn is_eof(&self) -> bool {
        self.0.kind == ErrorKind::Eof
    }

    pub fn is_syntax(&self) -> bool {
        self.0.kind == ErrorKind::Syntax
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Inner {
            kind,
            offset,
            expected,
        } = &*self.0;
        match kind {
            ErrorKind::Eof => write!(
                f,
                "unexpected end of input at byte {offset}: expected {expected}"
            ),
            ErrorKind::Syntax => write!(f, "expected {expected} at byte {offset}"),
            ErrorKind::Shape => write!(f, "{expected} at byte {offset}"),
        }
    }
}

impl std::error::Error for Error {}

/// Validates `text` as one JSON value, as `serde_json::from_str::<IgnoredAny>` would.
pub fn validate(text: &str) -> Result<(), Error> {
    let mut c = Cursor::new(text);
    c.skip_value()?;
    c.finish()
}

/// The checking skip's fast pass over the value at `pos`: one loop, nothing but positions in
/// registers, no error values. It returns the end of the value, or `None` when the value is not
/// JSON or leaves the common road (nesting past 64 levels); [`Cursor::skip_value`] then runs
/// the exact pass, which decides and names the error. It accepts only what the exact pass
/// accepts, so acceptance is the exact pass's either way.
#[inline(always)]
fn fast_skip(bytes: &[u8], mut pos: usize) -> Option<usize> {
    // One bit per open container, innermost lowest: set for an object.
    let mut stack: u64 = 0;
    let mut depth: u32 = 0;
    // Whitespace is looked for only where a byte is not what compact JSON has there: the API
    // server sends compact JSON, and a test before every token is a tenth of the whole check.
    'value: loop {
        match *bytes.get(pos)? {
            b'"' => pos = fast_string(bytes, pos + 1)?,
            b'{' => {
                pos += 1;
                match token_at(bytes, &mut pos)? {
                    b'}' => pos += 1,
                    b'"' if depth < 64 => {
                        stack = stack << 1 | 1;
                        depth += 1;
                        pos = fast_key(bytes, pos + 1)?;
                        continue 'value;
                    }
                    _ => return None,
                }
            }
            b'[' => {
                pos += 1;
                if token_at(bytes, &mut pos)? == b']' {
                    pos += 1;
                } else if depth < 64 {
                    stack <<= 1;
                    depth += 1;
                    continue 'value;
                } else {
                    return None;
                }
            }
            b't' => pos = fast_word(bytes, pos, b"true")?,
            b'f' => pos = fast_word(bytes, pos, b"false")?,
            b'n' => pos = fast_word(bytes, pos, b"null")?,
            b'-' | b'0'..=b'9' => pos = fast_number(bytes, pos)?,
            b' ' | b'\n' | b'\r' | b'\t' => {
                pos = fast_ws(bytes, pos + 1);
                continue 'value;
            }
            _ => return None,
        }
        // A value ended: close containers until one continues with a comma.
        loop {
            if depth == 0 {
                return Some(pos);
            }
            let b = *bytes.get(pos)?;
            let object = stack & 1 == 1;
            if b == b',' {
                pos += 1;
                if object {
                    if token_at(bytes, &mut pos)? != b'"' {
                        return None;
                    }
                    pos = fast_key(bytes, pos + 1)?;
                }
                continue 'value;
            }
            // The comma and the closing bracket are tested before whitespace here, and the key's
            // colon in `fast_key` likewise, rather than reading the byte with `token_at`, which
            // costs a compare per token more.
            if b == if object { b'}' } else { b']' } {
                pos += 1;
                stack >>= 1;
                depth -= 1;
            } else if is_ws(b) {
                pos = fast_ws(bytes, pos);
            } else {
                return None;
            }
        }
    }
}

/// JSON whitespace: tested only where a token was expected and something else found.
#[inline(always)]
fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\n' | b'\r' | b'\t')
}

/// The byte at `pos`, after moving `pos` past any whitespace; the whitespace is looked for only
/// when the byte cannot start a token.
#[inline(always)]
fn token_at(bytes: &[u8], pos: &mut usize) -> Option<u8> {
    let b = *bytes.get(*pos)?;
    if b > b' ' {
        return Some(b);
    }
    *pos = fast_ws(bytes, *pos);
    bytes.get(*pos).copied()
}

/// Past JSON whitespace.
#[inline(always)]
fn fast_ws(bytes: &[u8], mut pos: usize) -> usize {
    while let Some(&b) = bytes.get(pos) {
        if b > b' ' || !matches!(b, b' ' | b'\n' | b'\r' | b'\t') {
            break;
        }
        pos += 1;
    }
    pos
}

/// Past a string body (from after its opening quote) and its closing quote; escapes are checked
/// for shape only, as by [`Cursor::skip_value`].
#[inline(always)]
fn fast_string(bytes: &[u8], mut pos: usize) -> Option<usize> {
    loop {
        pos += string_stop(bytes.get(pos..)?)?;
        match *bytes.get(pos)? {
            b'"' => return Some(pos + 1),
            b'\\' => match *bytes.get(pos + 1)? {
                b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => pos += 2,
                b'u' => {
                    if !bytes
                        .get(pos + 2..pos + 6)?
                        .iter()
                        .all(u8::is_ascii_hexdigit)
                    {
                        return None;
                    }
                    pos += 6;
                }
                _ => return None,
            },
            _ => return None,
        }
    }
}

/// Past a key (from after its opening quote) and its colon.
#[inline(always)]
fn fast_key(bytes: &[u8], pos: usize) -> Option<usize> {
    let mut pos = fast_string(bytes, pos)?;
    if bytes.get(pos) != Some(&b':') {
        pos = fast_ws(bytes, pos);
        if *bytes.get(pos)? != b':' {
            return None;
        }
    }
    Some(pos + 1)
}

/// Past `word` (`true`, `false`, `null`) at `pos`.
#[inline(always)]
fn fast_word(bytes: &[u8], pos: usize, word: &[u8]) -> Option<usize> {
    let end = pos + word.len();
    (bytes.get(pos..end)? == word).then_some(end)
}

/// Past a number at `pos`, checked for grammar only.
#[inline(always)]
fn fast_number(bytes: &[u8], mut pos: usize) -> Option<usize> {
    let digits = |mut pos: usize| {
        while bytes.get(pos).is_some_and(u8::is_ascii_digit) {
            pos += 1;
        }
        pos
    };
    if bytes.get(pos) == Some(&b'-') {
        pos += 1;
    }
    match *bytes.get(pos)? {
        // A leading zero before a digit: the exact pass names it.
        b'0' if bytes.get(pos + 1).is_some_and(u8::is_ascii_digit) => return None,
        b'0' => pos += 1,
        b'1'..=b'9' => pos = digits(pos + 1),
        _ => return None,
    }
    if bytes.get(pos) == Some(&b'.') {
        if !bytes.get(pos + 1)?.is_ascii_digit() {
            return None;
        }
        pos = digits(pos + 2);
    }
    if let Some(b'e' | b'E') = bytes.get(pos) {
        pos += 1;
        if let Some(b'+' | b'-') = bytes.get(pos) {
            pos += 1;
        }
        if !bytes.get(pos)?.is_ascii_digit() {
            return None;
        }
        pos = digits(pos + 1);
    }
    Some(pos)
}

/// The input as text: JSON is UTF-8, and checking it once up front is cheaper than per string.
pub fn utf8(bytes: &[u8]) -> Result<&str, Error> {
    std::str::from_utf8(bytes)
        .map_err(|e| Error::new(ErrorKind::Syntax, e.valid_up_to(), "UTF-8 text"))
}

/// Container kinds of the values being skipped, one bit per level, in a word while shallow and on
/// the heap only past 64 levels (serde's skip has no depth limit either).
struct Frames {
    depth: usize,
    low: u64,
    high: Vec<u64>,
}

impl Frames {
    fn new() -> Self {
        Frames {
            depth: 0,
            low: 0,
            high: Vec::new(),
        }
    }

    fn push(&mut self, object: bool) {
        let (word, bit) = (self.depth / 64, self.depth % 64);
        let mask = 1u64 << bit;
        let slot = if word == 0 {
            &mut self.low
        } else {
            if self.high.len() < word {
                self.high.push(0);
            }
            match self.high.get_mut(word - 1) {
                Some(w) => w,
                None => &mut self.low,
            }
        };
        if object {
            *slot |= mask;
        } else {
            *slot &= !mask;
        }
        self.depth += 1;
    }

    /// The innermost open container: `Some(true)` for an object.
    fn top(&self) -> Option<bool> {
        let d = self.depth.checked_sub(1)?;
        let (word, bit) = (d / 64, d % 64);
        let w = if word == 0 {
            self.low
        } else {
            self.high.get(word - 1).copied().unwrap_or(0)
        };
        Some(w >> bit & 1 == 1)
    }

    fn pop(&mut self) {
        self.depth = self.depth.saturating_sub(1);
    }
}

/// Index of the first byte in `bytes` that ends a run of plain string content: `"`, `\` or a
/// control character, which are also exactly the bytes a JSON writer must escape. Sixteen bytes
/// per step (`wide` compiles the compares to SSE2, NEON, or plain code elsewhere): most of a
/// pod's text is strings, so this loop is most of reading one.
#[inline(always)]
pub fn string_stop(bytes: &[u8]) -> Option<usize> {
    let mut chunks = bytes.chunks_exact(16);
    let mut at = 0;
    for chunk in &mut chunks {
        let Ok(lanes) = <[u8; 16]>::try_from(chunk) else {
            break;
        };
        let mask = stops(lanes);
        if mask != 0 {
            return Some(at + mask.trailing_zeros() as usize);
        }
        at += 16;
    }
    string_stop_tail(bytes, at)
}

/// The last 0–15 bytes, still in one step: the final 16 bytes of `bytes` again (the ones already
/// scanned hold no stop), or the whole of a shorter `bytes` padded with spaces. The names and
/// paths the patch writer escapes are mostly shorter than 16 bytes.
#[inline]
fn string_stop_tail(bytes: &[u8], at: usize) -> Option<usize> {
    if at >= bytes.len() {
        return None;
    }
    let (start, lanes) = match bytes.len().checked_sub(16) {
        Some(start) => (start, <[u8; 16]>::try_from(bytes.get(start..)?).ok()?),
        None => {
            let mut lanes = [b' '; 16];
            lanes.get_mut(..bytes.len())?.copy_from_slice(bytes);
            (0, lanes)
        }
    };
    let mask = stops(lanes);
    (mask != 0).then(|| start + mask.trailing_zeros() as usize)
}

/// One bit per byte of `lanes` that is `"`, `\` or below 0x20.
#[inline(always)]
fn stops(lanes: [u8; 16]) -> u32 {
    let x = u8x16::new(lanes);
    let (quote, slash, control) = (u8x16::splat(b'"'), u8x16::splat(b'\\'), u8x16::splat(0x1f));
    // Unsigned `x < 0x20` as `max(x, 0x1f) == 0x1f`: SSE2 has no unsigned byte compare.
    let hit = x.simd_eq(quote) | x.simd_eq(slash) | x.max(control).simd_eq(control);
    hit.to_bitmask()
}

fn hex(b: u8) -> Option<u16> {
    match b {
        b'0'..=b'9' => Some(u16::from(b - b'0')),
        b'a'..=b'f' => Some(u16::from(b - b'a' + 10)),
        b'A'..=b'F' => Some(u16::from(b - b'A' + 10)),
        _ => None,
    }
}

// Writing: the escape rules are the reader's string scan run the other way.

/// Appends `s` as a JSON string, escaped as serde_json escapes it.
pub fn push_json_str(out: &mut Vec<u8>, s: &str) {
    out.push(b'"');
    push_json_body(out, s);
    out.push(b'"');
}

/// Appends `s` escaped as serde_json escapes a string, without the quotes.
pub fn push_json_body(out: &mut Vec<u8>, s: &str) {
    let mut rest = s.as_bytes();
    while let Some(i) = string_stop(rest) {
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

/// A position in a JSON text. Methods that read a value skip the whitespace before it.
#[derive(Clone, Debug)]
pub struct Cursor<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(text: &'a str) -> Self {
        Cursor { text, pos: 0 }
    }

    /// The byte offset of the next unread byte.
    pub fn offset(&self) -> usize {
        self.pos
    }

    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    #[cold]
    fn err(&self, kind: ErrorKind, expected: &'static str) -> Error {
        Error::new(kind, self.pos, expected)
    }

    #[cold]
    fn syntax(&self, expected: &'static str) -> Error {
        self.err(ErrorKind::Syntax, expected)
    }

    #[cold]
    fn eof(&self, expected: &'static str) -> Error {
        self.err(ErrorKind::Eof, expected)
    }

    /// A wrong type where a reader wanted `expected`. A byte that cannot start a value is a
    /// syntax error, as in serde.
    #[cold]
    fn wrong_type(&self, expected: &'static str) -> Error {
        match self.bytes().get(self.pos) {
            Some(b'n' | b't' | b'f' | b'-' | b'0'..=b'9' | b'"' | b'[' | b'{') => {
                self.err(ErrorKind::Shape, expected)
            }
            Some(_) => self.syntax("a value"),
            None => self.eof("a value"),
        }
    }

    /// A shape error at the cursor, for readers built on the cursor (a repeated field).
    pub fn shape_error(&self, what: &'static str) -> Error {
        self.err(ErrorKind::Shape, what)
    }

    /// The next non-whitespace byte, not consumed.
    #[inline(always)]
    pub fn peek(&mut self) -> Option<u8> {
        let bytes = self.bytes();
        match bytes.get(self.pos) {
            Some(&b) if b > b' ' => return Some(b),
            // One space, as after `:` and `,` in indented or Python-style JSON.
            Some(b' ') => match bytes.get(self.pos + 1) {
                Some(&b) if b > b' ' => {
                    self.pos += 1;
                    return Some(b);
                }
                _ => {}
            },
            _ => {}
        }
        self.peek_slow()
    }

    fn peek_slow(&mut self) -> Option<u8> {
        let bytes = self.bytes();
        while let Some(&b) = bytes.get(self.pos) {
            match b {
                b' ' | b'\n' | b'\r' | b'\t' => self.pos += 1,
                _ => return Some(b),
            }
        }
        None
    }

    /// Reads one whole document with `read`: nothing but whitespace may follow the value.
    pub fn document<T>(
        mut self,
        read: impl FnOnce(&mut Self) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let value = read(&mut self)?;
        self.finish()?;
        Ok(value)
    }

    /// Succeeds only when nothing but whitespace is left.
    pub fn finish(&mut self) -> Result<(), Error> {
        match self.peek() {
            None => Ok(()),
            Some(_) => Err(self.syntax("the end of the input")),
        }
    }

    fn literal(&mut self, word: &'static [u8], expected: &'static str) -> Result<(), Error> {
        // The first byte was matched by the caller.
        for &w in word.iter().skip(1) {
            self.pos += 1;
            match self.bytes().get(self.pos) {
                Some(&b) if b == w => {}
                Some(_) => return Err(self.syntax(expected)),
                None => return Err(self.eof(expected)),
            }
        }
        self.pos += 1;
        Ok(())
    }

    /// Consumes a `null` if one is next; `Ok(false)` leaves any other value unread.
    #[inline]
    pub fn null(&mut self) -> Result<bool, Error> {
        match self.peek() {
            Some(b'n') => self.literal(b"null", "null").map(|()| true),
            Some(_) => Ok(false),
            None => Err(self.eof("a value")),
        }
    }

    /// Reads `true` or `false`.
    pub fn boolean(&mut self) -> Result<bool, Error> {
        match self.peek() {
            Some(b't') => self.literal(b"true", "true").map(|()| true),
            Some(b'f') => self.literal(b"false", "false").map(|()| false),
            _ => Err(self.wrong_type("a boolean")),
        }
    }

    fn digits(&mut self) {
        let bytes = self.bytes();
        while bytes.get(self.pos).is_some_and(u8::is_ascii_digit) {
            self.pos += 1;
        }
    }

    /// A number, checked for grammar only. Running out of input inside a number is a syntax error
    /// in serde, not an end-of-input one; so here.
    fn number(&mut self) -> Result<(), Error> {
        let bytes = self.bytes();
        if bytes.get(self.pos) == Some(&b'-') {
            self.pos += 1;
        }
        match bytes.get(self.pos) {
            Some(b'0') => {
                self.pos += 1;
                if bytes.get(self.pos).is_some_and(u8::is_ascii_digit) {
                    return Err(self.syntax("no leading zero in a number"));
                }
            }
            Some(b'1'..=b'9') => {
                self.pos += 1;
                self.digits();
            }
            _ => return Err(self.syntax("a digit")),
        }
        if bytes.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            if !bytes.get(self.pos).is_some_and(u8::is_ascii_digit) {
                return Err(self.syntax("a digit after the decimal point"));
            }
            self.digits();
        }
        if let Some(b'e' | b'E') = bytes.get(self.pos) {
            self.pos += 1;
            if let Some(b'+' | b'-') = bytes.get(self.pos) {
                self.pos += 1;
            }
            if !bytes.get(self.pos).is_some_and(u8::is_ascii_digit) {
                return Err(self.syntax("a digit in the exponent"));
            }
            self.digits();
        }
        Ok(())
    }

    /// Four hex digits after `\u`.
    fn hex4(&mut self) -> Result<u16, Error> {
        let bytes = self.bytes();
        let Some(quad) = bytes.get(self.pos..self.pos + 4) else {
            self.pos = bytes.len();
            return Err(self.eof("four hex digits"));
        };
        let mut n = 0u16;
        for &b in quad {
            match hex(b) {
                Some(v) => n = n << 4 | v,
                None => return Err(self.syntax("four hex digits")),
            }
        }
        self.pos += 4;
        Ok(n)
    }

    /// Moves to the next `"`, `\` or control character of a string body.
    #[inline(always)]
    fn seek_stop(&mut self) -> Result<u8, Error> {
        let bytes = self.bytes();
        let rest = bytes.get(self.pos..).unwrap_or_default();
        if let Some(i) = string_stop(rest)
            && let Some(&b) = rest.get(i)
        {
            self.pos += i;
            return Ok(b);
        }
        self.pos = bytes.len();
        Err(self.eof("the end of a string"))
    }

    /// Skips a string body after its opening quote; escapes are checked for shape only.
    #[inline(always)]
    fn skip_string_body(&mut self) -> Result<(), Error> {
        // Most strings hold no escape: one scan to the closing quote, inlined where it is used.
        if self.seek_stop()? == b'"' {
            self.pos += 1;
            return Ok(());
        }
        self.skip_string_rest()
    }

    /// The rest of a string body from a backslash or a control character.
    #[inline(never)]
    fn skip_string_rest(&mut self) -> Result<(), Error> {
        loop {
            match self.bytes().get(self.pos).copied().unwrap_or(0) {
                b'"' => {
                    self.pos += 1;
                    return Ok(());
                }
                b'\\' => {
                    self.pos += 1;
                    match self.bytes().get(self.pos) {
                        Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                            self.pos += 1;
                        }
                        Some(b'u') => {
                            self.pos += 1;
                            self.hex4()?;
                        }
                        Some(_) => return Err(self.syntax("an escape")),
                        None => return Err(self.eof("an escape")),
                    }
                }
                _ => return Err(self.syntax("no control character in a string")),
            }
            self.seek_stop()?;
        }
    }

    /// Decodes a string body after its opening quote: borrowed when it holds no escape.
    #[inline(always)]
    fn string_body(&mut self) -> Result<Cow<'a, str>, Error> {
        let text = self.text;
        let start = self.pos;
        match self.seek_stop()? {
            b'"' => {
                let s = text.get(start..self.pos).unwrap_or_default();
                self.pos += 1;
                return Ok(Cow::Borrowed(s));
            }
            b'\\' => {}
            _ => return Err(self.syntax("no control character in a string")),
        }
        self.decode_escaped(start).map(Cow::Owned)
    }

    #[cold]
    fn decode_escaped(&mut self, start: usize) -> Result<String, Error> {
        let text = self.text;
        let mut out = String::with_capacity(self.pos - start + 16);
        out.push_str(text.get(start..self.pos).unwrap_or_default());
        loop {
            // At a backslash.
            self.pos += 1;
            let Some(&e) = self.bytes().get(self.pos) else {
                return Err(self.eof("an escape"));
            };
            self.pos += 1;
            match e {
                b'"' => out.push('"'),
                b'\\' => out.push('\\'),
                b'/' => out.push('/'),
                b'b' => out.push('\u{8}'),
                b'f' => out.push('\u{c}'),
                b'n' => out.push('\n'),
                b'r' => out.push('\r'),
                b't' => out.push('\t'),
                b'u' => out.push(self.unicode_escape()?),
                _ => {
                    self.pos -= 1;
                    return Err(self.syntax("an escape"));
                }
            }
            let run = self.pos;
            let stop = self.seek_stop()?;
            out.push_str(text.get(run..self.pos).unwrap_or_default());
            match stop {
                b'"' => {
                    self.pos += 1;
                    return Ok(out);
                }
                b'\\' => {}
                _ => return Err(self.syntax("no control character in a string")),
            }
        }
    }

    /// The character of a `\u` escape (just read), pairing surrogates as serde does for text.
    fn unicode_escape(&mut self) -> Result<char, Error> {
        let n = self.hex4()?;
        let code = match n {
            0xDC00..=0xDFFF => return Err(self.syntax("a leading surrogate before a trailing one")),
            0xD800..=0xDBFF => {
                let bytes = self.bytes();
                for want in [b'\\', b'u'] {
                    match bytes.get(self.pos) {
                        Some(&b) if b == want => self.pos += 1,
                        Some(_) => {
                            self.pos += 1;
                            return Err(self.syntax("a trailing surrogate escape"));
                        }
                        None => return Err(self.eof("a trailing surrogate escape")),
                    }
                }
                let low = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return Err(self.syntax("a trailing surrogate escape"));
                }
                0x1_0000 + ((u32::from(n) - 0xD800) << 10 | (u32::from(low) - 0xDC00))
            }
            _ => u32::from(n),
        };
        char::from_u32(code).ok_or_else(|| self.syntax("a Unicode scalar value"))
    }

    /// Reads a string value.
    #[inline(always)]
    pub fn string(&mut self) -> Result<Cow<'a, str>, Error> {
        if let Some(s) = self.plain_string() {
            return Ok(Cow::Borrowed(s));
        }
        self.any_string()
    }

    /// The common case of [`Cursor::string`]: right at the cursor (no whitespace first), with no
    /// escape. `None` leaves the cursor where it was for the general reader.
    #[inline(always)]
    fn plain_string(&mut self) -> Option<&'a str> {
        let s = self.plain_at(self.pos)?;
        self.pos += s.len() + 2;
        Some(s)
    }

    #[inline(never)]
    fn any_string(&mut self) -> Result<Cow<'a, str>, Error> {
        match self.peek() {
            Some(b'"') => {
                self.pos += 1;
                self.string_body()
            }
            _ => Err(self.wrong_type("a string")),
        }
    }

    /// Opens an object; read its members with [`Cursor::key`].
    pub fn object(&mut self) -> Result<Members, Error> {
        match self.peek() {
            Some(b'{') => {
                self.pos += 1;
                Ok(Members { first: true })
            }
            _ => Err(self.wrong_type("an object")),
        }
    }

    /// The next key of an open object, with its colon consumed (the value is next), or `None`
    /// after the closing brace.
    #[inline(always)]
    pub fn key(&mut self, members: &mut Members) -> Result<Option<Cow<'a, str>>, Error> {
        if let Some(key) = self.plain_key(members) {
            return Ok(key.map(Cow::Borrowed));
        }
        self.any_key(members)
    }

    /// The common case of [`Cursor::key`], in compact text: `}`, or a key with no escape right at
    /// the cursor (after a comma unless it is the first) and its colon right after it. `None`
    /// leaves the cursor where it was for the general reader, which decides everything else.
    #[inline(always)]
    fn plain_key(&mut self, members: &mut Members) -> Option<Option<&'a str>> {
        let bytes = self.bytes();
        let mut pos = self.pos;
        match *bytes.get(pos)? {
            b'}' => {
                self.pos = pos + 1;
                return Some(None);
            }
            b',' if !members.first => pos += 1,
            b'"' if members.first => {}
            _ => return None,
        }
        let key = self.plain_at(pos)?;
        let colon = pos + key.len() + 2;
        if *bytes.get(colon)? != b':' {
            return None;
        }
        members.first = false;
        self.pos = colon + 1;
        Some(Some(key))
    }

    #[inline(never)]
    fn any_key(&mut self, members: &mut Members) -> Result<Option<Cow<'a, str>>, Error> {
        match self.peek() {
            Some(b'}') => {
                self.pos += 1;
                return Ok(None);
            }
            Some(b',') if !members.first => {
                self.pos += 1;
                match self.peek() {
                    Some(b'"') => {}
                    Some(b'}') => return Err(self.syntax("a key after a comma")),
                    Some(_) => return Err(self.syntax("a string key")),
                    None => return Err(self.eof("a key")),
                }
            }
            Some(b'"') if members.first => {}
            Some(_) if members.first => return Err(self.syntax("a string key")),
            Some(_) => return Err(self.syntax("`,` or `}`")),
            None => return Err(self.eof("`,` or `}`")),
        }
        members.first = false;
        self.pos += 1;
        let key = self.string_body()?;
        match self.peek() {
            Some(b':') => self.pos += 1,
            Some(_) => return Err(self.syntax("`:`")),
            None => return Err(self.eof("`:`")),
        }
        Ok(Some(key))
    }

    /// The common road of a small object in compact text whose members are strings without
    /// escapes, or `true`/`false` (an env entry `{"name":"A","value":"B"}`, a volume mount): calls
    /// `member` with each key and string value (`None` for a boolean) in order, and returns true
    /// past the closing brace. It returns false, with the cursor where it was, on anything else
    /// (whitespace, an escape, a number, `null`, a nested container) or when `member` returns
    /// false; the caller then reads the object with [`Cursor::object`] and must forget what
    /// `member` was given. What it accepts is exactly valid JSON.
    #[inline(always)]
    pub fn flat_object(
        &mut self,
        known: &[&'static str],
        mut member: impl FnMut(&'a str, Option<&'a str>) -> bool,
    ) -> bool {
        let bytes = self.bytes();
        let mut pos = self.pos;
        if bytes.get(pos) != Some(&b'{') {
            return false;
        }
        pos += 1;
        if bytes.get(pos) == Some(&b'}') {
            self.pos = pos + 1;
            return true;
        }
        loop {
            // A key and its colon: a known key is recognised whole (`"name":`), without a scan
            // for the end of the string.
            let key = match known.iter().find(|k| {
                let end = pos + 1 + k.len();
                bytes.get(pos) == Some(&b'"')
                    && bytes.get(pos + 1..end) == Some(k.as_bytes())
                    && bytes.get(end..end + 2) == Some(b"\":")
            }) {
                Some(k) => {
                    pos += k.len() + 3;
                    *k
                }
                None => {
                    let Some(key) = self.plain_at(pos) else {
                        return false;
                    };
                    pos += key.len() + 2;
                    if bytes.get(pos) != Some(&b':') {
                        return false;
                    }
                    pos += 1;
                    key
                }
            };
            // The value.
            match bytes.get(pos) {
                Some(b'"') => {
                    let Some(value) = self.plain_at(pos) else {
                        return false;
                    };
                    pos += value.len() + 2;
                    if !member(key, Some(value)) {
                        return false;
                    }
                }
                Some(b't') if bytes.get(pos..pos + 4) == Some(b"true") => {
                    pos += 4;
                    if !member(key, None) {
                        return false;
                    }
                }
                Some(b'f') if bytes.get(pos..pos + 5) == Some(b"false") => {
                    pos += 5;
                    if !member(key, None) {
                        return false;
                    }
                }
                _ => return false,
            }
            match bytes.get(pos) {
                Some(b',') => pos += 1,
                Some(b'}') => {
                    self.pos = pos + 1;
                    return true;
                }
                _ => return false,
            }
        }
    }

    /// The body of the string whose opening quote is at `pos`, when it holds no escape (and so
    /// ends at the first `"`, with no control character before it).
    #[inline(always)]
    fn plain_at(&self, pos: usize) -> Option<&'a str> {
        let bytes = self.bytes();
        if *bytes.get(pos)? != b'"' {
            return None;
        }
        let start = pos + 1;
        let end = start + string_stop(bytes.get(start..)?)?;
        if *bytes.get(end)? != b'"' {
            return None;
        }
        self.text.get(start..end)
    }

    /// Opens an array; read its items with [`Cursor::item`].
    pub fn array(&mut self) -> Result<Members, Error> {
        match self.peek() {
            Some(b'[') => {
                self.pos += 1;
                Ok(Members { first: true })
            }
            _ => Err(self.wrong_type("an array")),
        }
    }

    /// True when another item follows (the cursor is then at it); false after the closing bracket.
    #[inline(always)]
    pub fn item(&mut self, items: &mut Members) -> Result<bool, Error> {
        // Compact text: `,` then the item's first byte, or `]`, or the first item right here.
        let bytes = self.bytes();
        match bytes.get(self.pos) {
            Some(b',')
                if !items.first
                    && bytes
                        .get(self.pos + 1)
                        .is_some_and(|&b| b > b' ' && b != b']') =>
            {
                self.pos += 1;
                return Ok(true);
            }
            Some(b']') => {
                self.pos += 1;
                return Ok(false);
            }
            Some(&b) if items.first && b > b' ' => {
                items.first = false;
                return Ok(true);
            }
            _ => {}
        }
        self.any_item(items)
    }

    #[inline(never)]
    fn any_item(&mut self, items: &mut Members) -> Result<bool, Error> {
        match self.peek() {
            Some(b']') => {
                self.pos += 1;
                Ok(false)
            }
            Some(b',') if !items.first => {
                self.pos += 1;
                match self.peek() {
                    Some(b']') => Err(self.syntax("an item after a comma")),
                    _ => Ok(true),
                }
            }
            Some(_) if items.first => {
                items.first = false;
                Ok(true)
            }
            Some(_) => Err(self.syntax("`,` or `]`")),
            None => Err(self.eof("`,` or `]`")),
        }
    }

    /// The text of the next value, validated as [`Cursor::skip_value`] does.
    pub fn raw_value(&mut self) -> Result<&'a str, Error> {
        self.peek();
        let start = self.pos;
        self.skip_value()?;
        Ok(self.since(start))
    }

    /// The text from offset `start` to the cursor.
    pub fn since(&self, start: usize) -> &'a str {
        self.text.get(start..self.pos).unwrap_or_default()
    }

    /// Skips the next value, checking it is JSON. Iterative: nesting depth costs a bit per level,
    /// not a stack frame.
    #[inline]
    pub fn skip_value(&mut self) -> Result<(), Error> {
        if let Some(end) = fast_skip(self.bytes(), self.pos) {
            self.pos = end;
            return Ok(());
        }
        self.skip_exact()
    }

    /// The checking skip that names what is wrong; the fast pass leaves every error to it.
    #[cold]
    #[inline(never)]
    fn skip_exact(&mut self) -> Result<(), Error> {
        let mut frames = Frames::new();
        // The innermost container, kept out of `frames`: it is consulted after every value.
        let mut top: Option<bool> = None;
        loop {
            // A value starts here.
            match self.peek() {
                Some(b'"') => {
                    self.pos += 1;
                    self.skip_string_body()?;
                }
                Some(b'-' | b'0'..=b'9') => self.number()?,
                Some(b'n') => self.literal(b"null", "null")?,
                Some(b't') => self.literal(b"true", "true")?,
                Some(b'f') => self.literal(b"false", "false")?,
                Some(b'[') => {
                    self.pos += 1;
                    if self.peek() == Some(b']') {
                        self.pos += 1;
                    } else {
                        frames.push(false);
                        top = Some(false);
                        continue;
                    }
                }
                Some(b'{') => {
                    self.pos += 1;
                    match self.peek() {
                        Some(b'}') => {
                            self.pos += 1;
                        }
                        Some(b'"') => {
                            frames.push(true);
                            top = Some(true);
                            self.skip_key()?;
                            continue;
                        }
                        Some(_) => return Err(self.syntax("a string key")),
                        None => return Err(self.eof("a key")),
                    }
                }
                Some(_) => return Err(self.syntax("a value")),
                None => return Err(self.eof("a value")),
            }
            // A value ended: close containers until one continues with a comma.
            loop {
                let Some(object) = top else {
                    return Ok(());
                };
                match self.peek() {
                    Some(b',') => {
                        self.pos += 1;
                        if object {
                            match self.peek() {
                                Some(b'"') => self.skip_key()?,
                                Some(_) => return Err(self.syntax("a string key")),
                                None => return Err(self.eof("a key")),
                            }
                        }
                        break;
                    }
                    Some(b']') if !object => {
                        self.pos += 1;
                        frames.pop();
                        top = frames.top();
                    }
                    Some(b'}') if object => {
                        self.pos += 1;
                        frames.pop();
                        top = frames.top();
                    }
                    Some(_) if object => return Err(self.syntax("`,` or `}`")),
                    Some(_) => return Err(self.syntax("`,` or `]`")),
                    None if object => return Err(self.eof("`,` or `}`")),
                    None => return Err(self.eof("`,` or `]`")),
                }
            }
        }
    }

    /// Skips a key (at its opening quote) and its colon.
    fn skip_key(&mut self) -> Result<(), Error> {
        self.pos += 1;
        self.skip_string_body()?;
        match self.peek() {
            Some(b':') => {
                self.pos += 1;
                Ok(())
            }
            Some(_) => Err(self.syntax("`:`")),
            None => Err(self.eof("`:`")),
        }
    }
}

/// The state of an open object or array.
#[derive(Debug)]
pub struct Members {
    first: bool,
}
