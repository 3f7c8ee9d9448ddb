//! Byte-level JSON scanning for the streaming extractor ([`crate::extract`]):
//! no tree, no allocation per element.
//!
//! Every function here reproduces, byte for byte, what `serde_json` 1.0
//! accepts in one of three string contexts, because the extractor must reject
//! exactly the bodies the former serde-based extractor rejected:
//! - **ignored** (serde's `IgnoredAny`): strict JSON syntax, control characters
//!   forbidden in strings, escape syntax checked (`\u` needs four hex digits),
//!   but neither UTF-8 nor surrogate pairing checked ([`skip_value`] with
//!   `utf8 = false`);
//! - **raw** (serde's `RawValue`): the same, and the bytes must be UTF-8
//!   ([`skip_value`] with `utf8 = true`);
//! - **typed string** (serde's `parse_str`: struct keys, string fields, every
//!   string of a `Value`): also surrogate pairs checked ([`decode_str`]).
//!
//! Numbers follow JSON's grammar ([`skip_number`]); their value matters only
//! in canonical JSON ([`Canon`]), which hands non-trivial numbers to
//! `serde_json` itself so that parsing and printing stay identical.
//!
//! Nesting: ignored and raw values may nest arbitrarily deep, as in serde
//! (whose `ignore_value` is iterative); their open brackets are kept one bit
//! per level ([`Frames`]), so memory is at most body bytes / 8. Values parsed
//! into a `serde_json::Value` by the former extractor (tools, tool calls,
//! non-text parts) keep serde's recursion limit: at most 127 nested
//! containers ([`MAX_DEPTH`]), walked with fixed-size stacks.

use std::cmp::Ordering;

/// A parse failure: where and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fail {
    /// Byte offset in the body.
    pub at: usize,
    /// What was wrong.
    pub what: &'static str,
}

/// Result of a scanning step.
pub type Res<T> = Result<T, Fail>;

#[cold]
pub(crate) fn fail<T>(at: usize, what: &'static str) -> Res<T> {
    Err(Fail { at, what })
}

/// serde_json's recursion limit: at most this many nested containers in a
/// value parsed as a whole (`remaining_depth` 128, an error when it reaches 0).
pub const MAX_DEPTH: usize = 127;

/// Index of the first non-whitespace byte at or after `i`.
#[inline]
pub fn ws(b: &[u8], mut i: usize) -> usize {
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = b.get(i) {
        i += 1;
    }
    i
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGH: u64 = 0x8080_8080_8080_8080;

/// High bit set in each byte of `w` that is `"`, `\` or below 0x20 (the
/// lowest set bit is exact; higher ones may be false positives).
#[inline(always)]
fn stop_mask(w: u64) -> u64 {
    let ctrl = w.wrapping_sub(ONES * 0x20) & !w;
    let q = w ^ (ONES * u64::from(b'"'));
    let q = q.wrapping_sub(ONES) & !q;
    let s = w ^ (ONES * u64::from(b'\\'));
    let s = s.wrapping_sub(ONES) & !s;
    (ctrl | q | s) & HIGH
}

/// [`stop_mask`] for a word of ASCII bytes (no byte >= 0x80): then a byte's
/// subtraction can set its high bit only by borrowing, which first happens
/// at the lowest byte that is a stop, so the `& !w` terms are not needed.
#[inline(always)]
fn stop_mask_ascii(w: u64) -> u64 {
    let ctrl = w.wrapping_sub(ONES * 0x20);
    let q = (w ^ (ONES * u64::from(b'"'))).wrapping_sub(ONES);
    let s = (w ^ (ONES * u64::from(b'\\'))).wrapping_sub(ONES);
    (ctrl | q | s) & HIGH
}

#[inline(always)]
fn word(c: &[u8]) -> u64 {
    match c.first_chunk::<8>() {
        Some(a) => u64::from_le_bytes(*a),
        None => 0,
    }
}

/// The first index at or after `i` holding `"`, `\` or a control byte (or
/// `b.len()`), and whether a byte >= 0x80 may occur in `b[i..that]` (never
/// false when one does).
#[inline]
pub fn scan_special(b: &[u8], i: usize) -> (usize, bool) {
    let Some(rest) = b.get(i..) else {
        return (b.len(), false);
    };
    let mut hi = false;
    let mut off = 0usize;
    let mut it = rest.chunks_exact(16);
    for c in &mut it {
        let (x, y) = c.split_at(8);
        let (w0, w1) = (word(x), word(y));
        let (m0, m1) = if (w0 | w1) & HIGH == 0 {
            (stop_mask_ascii(w0), stop_mask_ascii(w1))
        } else {
            hi = true;
            (stop_mask(w0), stop_mask(w1))
        };
        if m0 != 0 {
            return (i + off + (m0.trailing_zeros() / 8) as usize, hi);
        }
        if m1 != 0 {
            return (i + off + 8 + (m1.trailing_zeros() / 8) as usize, hi);
        }
        off += 16;
    }
    for &c in it.remainder() {
        if c == b'"' || c == b'\\' || c < 0x20 {
            return (i + off, hi);
        }
        hi |= c >= 0x80;
        off += 1;
    }
    (i + off, hi)
}

/// Four hex digits at `i` (serde's `decode_hex_escape`).
#[inline]
fn hex4(b: &[u8], i: usize) -> Res<(u16, usize)> {
    match b.get(i..i.saturating_add(4)) {
        Some(&[p, q, r, s]) => {
            let mut v: u16 = 0;
            for d in [p, q, r, s] {
                let x = match d {
                    b'0'..=b'9' => d - b'0',
                    b'a'..=b'f' => d - b'a' + 10,
                    b'A'..=b'F' => d - b'A' + 10,
                    _ => return fail(i, "invalid escape"),
                };
                v = (v << 4) | u16::from(x);
            }
            Ok((v, i + 4))
        }
        _ => fail(b.len(), "EOF while parsing a string"),
    }
}

/// Skip the rest of a string (`i` just after the opening quote), as serde's
/// `ignore_str`; with `utf8`, its bytes must also be UTF-8 (a `RawValue`).
/// Returns the index after the closing quote.
#[inline]
pub fn skip_str(b: &[u8], i: usize, utf8: bool) -> Res<usize> {
    // A short ASCII string without escapes (a key, a short value) inline.
    if let Some(c) = b.get(i..).and_then(|r| r.first_chunk::<8>()) {
        let w = u64::from_le_bytes(*c);
        let m = stop_mask(w);
        if m != 0 {
            let at = (m.trailing_zeros() / 8) as usize;
            if c.get(at) == Some(&b'"') && w & HIGH & (m - 1) == 0 {
                return Ok(i + at + 1);
            }
        }
    }
    skip_str_at(b, i, utf8)
}

/// [`skip_str`] out of line.
fn skip_str_at(b: &[u8], i: usize, utf8: bool) -> Res<usize> {
    let start = i;
    let mut i = i;
    let mut hi = false;
    loop {
        let (j, h) = scan_special(b, i);
        hi |= h;
        match b.get(j) {
            Some(b'"') => {
                if utf8 && hi && std::str::from_utf8(b.get(start..j).unwrap_or(&[])).is_err() {
                    return fail(start, "invalid unicode code point");
                }
                return Ok(j + 1);
            }
            Some(b'\\') => match b.get(j + 1) {
                Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i = j + 2,
                Some(b'u') => i = hex4(b, j + 2)?.1,
                Some(_) => return fail(j + 1, "invalid escape"),
                None => return fail(j + 1, "EOF while parsing a string"),
            },
            Some(_) => return fail(j, "control character in string"),
            None => return fail(j, "EOF while parsing a string"),
        }
    }
}

/// Where decoded string bytes go: `raw` segments are copied from the body
/// (never `"`, `\` or a control byte), `esc` is one character decoded from
/// an escape.
pub trait StrOut {
    /// A run of bytes as written in the body.
    fn raw(&mut self, seg: &[u8]);
    /// The UTF-8 of one escaped character.
    fn esc(&mut self, ch: &[u8]);
}

/// Discards the string (validation only).
pub struct NoOut;
impl StrOut for NoOut {
    #[inline]
    fn raw(&mut self, _: &[u8]) {}
    #[inline]
    fn esc(&mut self, _: &[u8]) {}
}

/// `s` (at most 15 bytes, no NUL) as a little-endian word, zero past its
/// end: how [`key_word`] gives a short key.
#[allow(clippy::indexing_slicing)] // evaluated at compile time
pub const fn word_of(s: &[u8]) -> u128 {
    let mut w = 0u128;
    let mut k = 0;
    while k < s.len() {
        w |= (s[k] as u128) << (8 * k);
        k += 1;
    }
    w
}

/// The rest of a string (`i` just after its opening quote) when it is at
/// most 15 bytes without escapes or control bytes (and, unless
/// `utf8_known`, ASCII): its bytes as a word (see [`word_of`]) and the
/// index after the closing quote, found in one step. None otherwise (then
/// the caller decodes it).
#[inline]
pub fn key_word(b: &[u8], i: usize, utf8_known: bool) -> Option<(u128, usize)> {
    let c = b.get(i..)?.first_chunk::<16>()?;
    let w = u128::from_le_bytes(*c);
    let m = u128::from(stop_mask(w as u64)) | u128::from(stop_mask((w >> 64) as u64)) << 64;
    let at = (m.trailing_zeros() / 8) as usize;
    if c.get(at) != Some(&b'"') {
        return None;
    }
    let k = if at == 0 {
        0
    } else {
        w & (u128::MAX >> (128 - 8 * at))
    };
    let high = u128::from(HIGH) | u128::from(HIGH) << 64;
    if !utf8_known && k & high != 0 {
        return None;
    }
    Some((k, i + at + 1))
}

/// Writes into a small fixed buffer; `long` once it would overflow.
pub struct SmallOut {
    /// The bytes so far.
    pub buf: [u8; 16],
    /// How many of `buf` are used.
    pub len: usize,
    /// The string is longer than `buf`.
    pub long: bool,
}
impl SmallOut {
    /// Empty.
    pub fn new() -> Self {
        SmallOut {
            buf: [0; 16],
            len: 0,
            long: false,
        }
    }
    /// The string, if it fit.
    pub fn get(&self) -> Option<&[u8]> {
        if self.long {
            None
        } else {
            self.buf.get(..self.len)
        }
    }
    fn push(&mut self, s: &[u8]) {
        match self.buf.get_mut(self.len..self.len + s.len()) {
            Some(d) if !self.long => {
                d.copy_from_slice(s);
                self.len += s.len();
            }
            _ => self.long = true,
        }
    }
}
impl Default for SmallOut {
    fn default() -> Self {
        Self::new()
    }
}
impl StrOut for SmallOut {
    fn raw(&mut self, s: &[u8]) {
        self.push(s)
    }
    fn esc(&mut self, s: &[u8]) {
        self.push(s)
    }
}

/// Collects the decoded string.
impl StrOut for Vec<u8> {
    fn raw(&mut self, s: &[u8]) {
        self.extend_from_slice(s)
    }
    fn esc(&mut self, s: &[u8]) {
        self.extend_from_slice(s)
    }
}

/// Decode the rest of a string (`i` just after the opening quote) into
/// `out`, as serde's `parse_str` (surrogates must pair; with `utf8_known`
/// false its bytes must be UTF-8). Returns the index after the closing quote.
#[inline]
pub fn decode_str<O: StrOut>(b: &[u8], i: usize, utf8_known: bool, out: &mut O) -> Res<usize> {
    decode_str_at(b, i, utf8_known, out)
}

/// [`decode_str`] with a short string without escapes (a key, a short
/// value) in one step (for the walks of element-heavy values).
#[inline]
pub fn decode_str_fast<O: StrOut>(b: &[u8], i: usize, utf8_known: bool, out: &mut O) -> Res<usize> {
    if let Some(c) = b.get(i..).and_then(|r| r.first_chunk::<8>()) {
        let w = u64::from_le_bytes(*c);
        let m = stop_mask(w);
        if m != 0 {
            let at = (m.trailing_zeros() / 8) as usize;
            if c.get(at) == Some(&b'"') && (utf8_known || w & HIGH & (m - 1) == 0) {
                if let Some(seg) = c.get(..at).filter(|s| !s.is_empty()) {
                    out.raw(seg);
                }
                return Ok(i + at + 1);
            }
        }
    }
    decode_str_at(b, i, utf8_known, out)
}

#[inline]
fn decode_str_at<O: StrOut>(b: &[u8], i: usize, utf8_known: bool, out: &mut O) -> Res<usize> {
    let mut i = i;
    loop {
        let (j, hi) = scan_special(b, i);
        let seg = b.get(i..j).unwrap_or(&[]);
        if hi && !utf8_known && std::str::from_utf8(seg).is_err() {
            return fail(i, "invalid unicode code point");
        }
        if !seg.is_empty() {
            out.raw(seg);
        }
        match b.get(j) {
            Some(b'"') => return Ok(j + 1),
            Some(b'\\') => i = decode_escape(b, j + 1, out)?,
            Some(_) => return fail(j, "control character in string"),
            None => return fail(j, "EOF while parsing a string"),
        }
    }
}

/// One escape (`i` just after the backslash), written to `out`; returns
/// the index after it.
#[inline]
fn decode_escape<O: StrOut>(b: &[u8], i: usize, out: &mut O) -> Res<usize> {
    let (c, j) = escape_char(b, i)?;
    let mut buf = [0u8; 4];
    out.esc(c.encode_utf8(&mut buf).as_bytes());
    Ok(j)
}

/// The character of one escape (`i` just after the backslash), as serde's
/// `parse_escape` with surrogates required to pair; and the index after it.
fn escape_char(b: &[u8], i: usize) -> Res<(char, usize)> {
    let c = match b.get(i) {
        Some(c) => *c,
        None => return fail(i, "EOF while parsing a string"),
    };
    let one = match c {
        b'"' => '"',
        b'\\' => '\\',
        b'/' => '/',
        b'b' => '\u{8}',
        b'f' => '\u{c}',
        b'n' => '\n',
        b'r' => '\r',
        b't' => '\t',
        b'u' => {
            let (n, j) = hex4(b, i + 1)?;
            if (0xDC00..=0xDFFF).contains(&n) {
                return fail(j, "lone leading surrogate in hex escape");
            }
            if !(0xD800..=0xDBFF).contains(&n) {
                return match char::from_u32(u32::from(n)) {
                    Some(c) => Ok((c, j)),
                    None => fail(j, "invalid escape"),
                };
            }
            match b.get(j) {
                Some(b'\\') => {}
                Some(_) => return fail(j, "unexpected end of hex escape"),
                None => return fail(j, "EOF while parsing a string"),
            }
            match b.get(j + 1) {
                Some(b'u') => {}
                Some(_) => return fail(j + 1, "unexpected end of hex escape"),
                None => return fail(j + 1, "EOF while parsing a string"),
            }
            let (n2, k) = hex4(b, j + 2)?;
            if !(0xDC00..=0xDFFF).contains(&n2) {
                return fail(k, "lone leading surrogate in hex escape");
            }
            let c = ((u32::from(n - 0xD800) << 10) | u32::from(n2 - 0xDC00)) + 0x1_0000;
            return match char::from_u32(c) {
                Some(c) => Ok((c, k)),
                None => fail(k, "invalid escape"),
            };
        }
        _ => return fail(i, "invalid escape"),
    };
    Ok((one, i + 1))
}

/// [`skip_number`] with a lone digit (the element of a number-heavy body)
/// taken inline.
#[inline(always)]
pub fn skip_number_fast(b: &[u8], i: usize) -> Res<usize> {
    if let (Some(b'0'..=b'9'), next) = (b.get(i), b.get(i + 1)) {
        if !matches!(next, Some(b'0'..=b'9' | b'.' | b'e' | b'E')) {
            return Ok(i + 1);
        }
    }
    skip_number(b, i)
}

/// Skip a number starting at `i` (`-` or a digit), by JSON's grammar.
#[inline(never)]
pub fn skip_number(b: &[u8], mut i: usize) -> Res<usize> {
    if b.get(i) == Some(&b'-') {
        i += 1;
    }
    match b.get(i) {
        Some(b'0') => {
            i += 1;
            if let Some(b'0'..=b'9') = b.get(i) {
                return fail(i, "invalid number");
            }
        }
        Some(b'1'..=b'9') => {
            i += 1;
            while let Some(b'0'..=b'9') = b.get(i) {
                i += 1;
            }
        }
        _ => return fail(i, "invalid number"),
    }
    if b.get(i) == Some(&b'.') {
        i = digits(b, i + 1)?;
    }
    if let Some(b'e' | b'E') = b.get(i) {
        i += 1;
        if let Some(b'+' | b'-') = b.get(i) {
            i += 1;
        }
        i = digits(b, i)?;
    }
    Ok(i)
}

/// One or more digits at `i` (a fraction or an exponent); the index after.
#[inline]
fn digits(b: &[u8], mut i: usize) -> Res<usize> {
    let s = i;
    while let Some(b'0'..=b'9') = b.get(i) {
        i += 1;
    }
    if i == s {
        return fail(i, "invalid number");
    }
    Ok(i)
}

/// Skip the literal `lit` at `i`.
#[inline]
pub fn skip_lit(b: &[u8], i: usize, lit: &'static [u8]) -> Res<usize> {
    for (k, &c) in lit.iter().enumerate() {
        match b.get(i + k) {
            Some(&x) if x == c => {}
            Some(_) => return fail(i + k, "expected ident"),
            None => return fail(i + k, "EOF while parsing a value"),
        }
    }
    Ok(i + lit.len())
}

/// `:` after an object key (whitespace first); returns the index after it.
#[inline]
pub fn colon(b: &[u8], i: usize) -> Res<usize> {
    let i = ws(b, i);
    match b.get(i) {
        Some(b':') => Ok(i + 1),
        Some(_) => fail(i, "expected `:`"),
        None => fail(i, "EOF while parsing an object"),
    }
}

/// What [`Work::charge`] fails with: the body needs more work than its
/// budget (a counted fallback, not a parse error).
pub const TOO_COMPLEX: &str = "body too complex";

/// A budget of extraction work, in nanoseconds as measured natively (see
/// `crate::extract`'s "Cost"): each element a walk meets is charged its
/// measured cost, and a walk stops with [`TOO_COMPLEX`] when the budget is
/// spent. No clock: the same body is charged the same everywhere.
/// Unlimited by default.
#[derive(Debug, Clone, Copy)]
pub struct Work(pub u64);

impl Default for Work {
    fn default() -> Self {
        Work(u64::MAX)
    }
}

impl Work {
    /// Spend `n`; fails at `at` once the budget is spent.
    #[inline(always)]
    pub fn charge(&mut self, n: u64, at: usize) -> Res<()> {
        match self.0.checked_sub(n) {
            Some(left) => {
                self.0 = left;
                Ok(())
            }
            None => Err(Fail {
                at,
                what: TOO_COMPLEX,
            }),
        }
    }
}

/// Charges, in ns: what each element costs natively, measured on the
/// bodies of `tests/bodies/mod.rs` (the throughput probe's
/// `probe_budget` prints each body's charge beside its time).
pub mod cost {
    /// A value skipped or checked by the first pass (with its key).
    pub const TOKEN: u64 = 5;
    /// A struct member read (key matched) by either pass.
    pub const MEMBER: u64 = 15;
    /// A message, in each pass.
    pub const MESSAGE: u64 = 3;
    /// An object content part walked for its text (second pass).
    pub const PART: u64 = 20;
    /// A marker of a non-text part whose hex is memoized.
    pub const MARKER: u64 = 10;
    /// A marker's hash and hex when not memoized.
    pub const HASH: u64 = 20;
    /// A value of canonical JSON (checked, indexed, written; with its key).
    pub const CANON: u64 = 30;
    /// A key of a reordered object, per level of the sort.
    pub const SORT: u64 = 2;
}

/// Open containers of an ignored value, one bit per level (1: object):
/// the top 1 to 64 levels in `cur`, the levels below in full words; and
/// the walk's [`Work`] budget.
#[derive(Debug, Default)]
pub struct Frames {
    cur: u64,
    words: Vec<u64>,
    len: usize,
    /// What is left of the budget.
    pub work: Work,
}

impl Frames {
    #[inline]
    fn push(&mut self, obj: bool) {
        if self.len == 64 * (self.words.len() + 1) {
            self.words.push(self.cur);
        }
        let bit = self.len % 64;
        self.cur = (self.cur & !(1 << bit)) | (u64::from(obj) << bit);
        self.len += 1;
    }

    #[inline]
    fn pop(&mut self) {
        self.len = self.len.saturating_sub(1);
        if self.len == 64 * self.words.len() && self.len > 0 {
            self.cur = self.words.pop().unwrap_or(0);
        }
    }

    #[inline]
    fn top_is_obj(&self) -> bool {
        match self.len.checked_sub(1) {
            Some(n) => self.cur >> (n % 64) & 1 != 0,
            None => false,
        }
    }
}

/// How clients open a chat text part, `type` then `text`, written compactly
/// (JSON.stringify, serde). The extractor takes such a part's first two
/// members without its member walk.
pub const TEXT_PART_HEAD: &[u8; 23] = br#"{"type":"text","text":""#;

/// The index after [`TEXT_PART_HEAD`] (inside the text's string) if `b`
/// has it at `i`.
#[inline]
pub fn text_part_head(b: &[u8], i: usize) -> Option<usize> {
    (b.get(i..)?.first_chunk::<23>() == Some(TEXT_PART_HEAD)).then_some(i + 23)
}

/// Skip one value (leading whitespace first), as serde's `ignore_value`
/// (with `utf8`: as a `RawValue`, whose bytes must be UTF-8). Any depth.
/// Returns the index after the value.
pub fn skip_value(b: &[u8], i: usize, utf8: bool, st: &mut Frames) -> Res<usize> {
    let base = st.len;
    let mut i = i;
    loop {
        i = ws(b, i);
        st.work.charge(cost::TOKEN, i)?;
        match b.get(i) {
            Some(b'"') => i = skip_str(b, i + 1, utf8)?,
            Some(b'-' | b'0'..=b'9') => {
                // Digits cost about 1 ns each.
                let j = skip_number_fast(b, i)?;
                st.work.charge((j - i) as u64, i)?;
                i = j;
            }
            Some(b'n') => i = skip_lit(b, i, b"null")?,
            Some(b't') => i = skip_lit(b, i, b"true")?,
            Some(b'f') => i = skip_lit(b, i, b"false")?,
            Some(b'[') => {
                i = ws(b, i + 1);
                if b.get(i) == Some(&b']') {
                    i += 1;
                } else {
                    st.push(false);
                    continue;
                }
            }
            Some(b'{') => {
                i = ws(b, i + 1);
                match b.get(i) {
                    Some(b'}') => i += 1,
                    Some(b'"') => {
                        i = colon(b, skip_str(b, i + 1, utf8)?)?;
                        st.push(true);
                        continue;
                    }
                    Some(_) => return fail(i, "key must be a string"),
                    None => return fail(i, "EOF while parsing an object"),
                }
            }
            Some(_) => return fail(i, "expected value"),
            None => return fail(i, "EOF while parsing a value"),
        }
        // A value ended: close what it ends.
        loop {
            if st.len == base {
                return Ok(i);
            }
            i = ws(b, i);
            let obj = st.top_is_obj();
            match b.get(i) {
                Some(b',') => {
                    i += 1;
                    if obj {
                        i = ws(b, i);
                        match b.get(i) {
                            Some(b'"') => i = colon(b, skip_str(b, i + 1, utf8)?)?,
                            Some(_) => return fail(i, "key must be a string"),
                            None => return fail(i, "EOF while parsing a value"),
                        }
                    }
                    break;
                }
                Some(b']') if !obj => {
                    i += 1;
                    st.pop();
                }
                Some(b'}') if obj => {
                    i += 1;
                    st.pop();
                }
                Some(_) => return fail(i, "expected `,` or end of container"),
                None => return fail(i, "EOF while parsing a container"),
            }
        }
    }
}

/// Skip one value already known to be valid JSON (structure only: strings
/// to their closing quote, brackets counted). Never panics on bad input;
/// returns an error at the end of input.
pub fn fast_skip(b: &[u8], i: usize) -> Res<usize> {
    let mut i = ws(b, i);
    let mut depth: usize = 0;
    loop {
        match b.get(i) {
            Some(b'"') => {
                i += 1;
                loop {
                    let (j, _) = scan_special(b, i);
                    match b.get(j) {
                        Some(b'"') => {
                            i = j + 1;
                            break;
                        }
                        Some(b'\\') => i = j + 2,
                        Some(_) => i = j + 1,
                        None => return fail(j, "EOF while parsing a string"),
                    }
                }
            }
            Some(b'[' | b'{') => {
                depth += 1;
                i += 1;
                continue;
            }
            Some(b']' | b'}') => {
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Some(b',' | b':' | b' ' | b'\n' | b'\t' | b'\r') => {
                i += 1;
                continue;
            }
            Some(_) => {
                // A scalar: up to the next delimiter.
                while let Some(c) = b.get(i) {
                    if matches!(c, b',' | b']' | b'}' | b':' | b' ' | b'\n' | b'\t' | b'\r') {
                        break;
                    }
                    i += 1;
                }
            }
            None => return fail(i, "EOF while parsing a value"),
        }
        if depth == 0 {
            return Ok(i);
        }
    }
}

/// Decoded bytes of a (validated) string starting at its opening quote.
struct StrBytes<'b> {
    b: &'b [u8],
    i: usize,
    pend: [u8; 4],
    plen: u8,
    pidx: u8,
}

impl Iterator for StrBytes<'_> {
    type Item = u8;
    fn next(&mut self) -> Option<u8> {
        if self.pidx < self.plen {
            let c = self.pend.get(usize::from(self.pidx)).copied();
            self.pidx += 1;
            return c;
        }
        match self.b.get(self.i) {
            None | Some(b'"') => None,
            Some(b'\\') => match escape_char(self.b, self.i + 1) {
                Ok((c, j)) => {
                    self.i = j;
                    let n = c.encode_utf8(&mut self.pend).len();
                    self.plen = n as u8;
                    self.pidx = 0;
                    self.next()
                }
                Err(_) => None,
            },
            Some(&c) => {
                self.i += 1;
                Some(c)
            }
        }
    }
}

fn str_bytes(b: &[u8], q: usize) -> StrBytes<'_> {
    StrBytes {
        b,
        i: q + 1,
        pend: [0; 4],
        plen: 0,
        pidx: 0,
    }
}

/// Compare two (validated) strings by their decoded bytes, as `String`'s
/// order; `x` and `y` are the offsets of their opening quotes.
pub fn cmp_str(b: &[u8], x: usize, y: usize) -> Ordering {
    // Eight bytes at a time while neither has an escape or its end.
    let (mut p, mut q) = (x + 1, y + 1);
    while let (Some(u), Some(v)) = (b.get(p..p + 8), b.get(q..q + 8)) {
        let (u, v) = (word(u), word(v));
        let (mu, mv) = (quote_mask(u), quote_mask(v));
        let su = if mu == 0 {
            64
        } else {
            mu.trailing_zeros() & !7
        };
        let sv = if mv == 0 {
            64
        } else {
            mv.trailing_zeros() & !7
        };
        let s = su.min(sv);
        let diff = u ^ v;
        let d = if diff == 0 {
            64
        } else {
            diff.trailing_zeros() & !7
        };
        if d < s {
            // Both go on with plain bytes up to a first difference.
            return ((u >> d) as u8).cmp(&((v >> d) as u8));
        }
        if s == 64 {
            p += 8;
            q += 8;
            continue;
        }
        // Equal up to a quote or a backslash at byte s/8 of one or both.
        let (cu, cv) = ((u >> s) as u8, (v >> s) as u8);
        match (cu == b'"', cv == b'"') {
            (true, true) => return Ordering::Equal,
            (true, false) => return Ordering::Less,
            (false, true) => return Ordering::Greater,
            (false, false) => {
                // An escape: decode.
                return str_bytes(b, x).cmp(str_bytes(b, y));
            }
        }
    }
    // Byte by byte while neither has an escape: equal so far means equal
    // decoded bytes so far; a closing quote ends the shorter string.
    while let (Some(&c), Some(&d)) = (b.get(p), b.get(q)) {
        if c == b'\\' || d == b'\\' {
            break;
        }
        if c != d {
            return match (c, d) {
                (b'"', _) => Ordering::Less,
                (_, b'"') => Ordering::Greater,
                _ => c.cmp(&d),
            };
        }
        if c == b'"' {
            return Ordering::Equal;
        }
        p += 1;
        q += 1;
    }
    str_bytes(b, x).cmp(str_bytes(b, y))
}

/// High bit set in each byte of `w` that is `"` or `\` (the lowest set
/// bit is exact; higher ones may be false positives).
#[inline(always)]
fn quote_mask(w: u64) -> u64 {
    let q = w ^ (ONES * u64::from(b'"'));
    let q = q.wrapping_sub(ONES) & !q;
    let s = w ^ (ONES * u64::from(b'\\'));
    let s = s.wrapping_sub(ONES) & !s;
    (q | s) & HIGH
}

/// Whether the (validated) string at `q` decodes to `lit` (which has no
/// `"` or `\`).
pub fn str_is(b: &[u8], q: usize, lit: &[u8]) -> bool {
    let mut p = q + 1;
    for &l in lit {
        match b.get(p) {
            Some(b'\\') => return str_bytes(b, q).eq(lit.iter().copied()),
            Some(&c) if c == l => p += 1,
            _ => return false,
        }
    }
    match b.get(p) {
        Some(b'"') => true,
        Some(b'\\') => str_bytes(b, q).eq(lit.iter().copied()),
        _ => false,
    }
}

/// Where canonical JSON goes.
pub trait Put {
    /// Next bytes.
    fn put(&mut self, bytes: &[u8]);
}

impl Put for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Bytes of canonical JSON staged before they reach the caller's [`Put`]
/// (and of the extractor's output before its sink).
pub(crate) const STAGE: usize = 1024;

/// A staging buffer: small writes gather in `buf` and reach the sink a
/// buffer at a time (a write of half the buffer or more goes straight
/// through). The bytes and their order are the same as unstaged. Shared by
/// canonical JSON ([`Stage`]) and the prompt extractor's output.
pub(crate) struct Staging<B> {
    buf: B,
    len: usize,
}

impl<B: AsMut<[u8]>> Staging<B> {
    pub(crate) fn new(buf: B) -> Self {
        Staging { buf, len: 0 }
    }

    #[inline]
    pub(crate) fn put<W: Put + ?Sized>(&mut self, x: &[u8], out: &mut W) {
        let len = self.len;
        if let Some(d) = self.buf.as_mut().get_mut(len..len + x.len()) {
            d.copy_from_slice(x);
            self.len = len + x.len();
        } else {
            self.spill(x, out);
        }
    }

    #[inline(never)]
    fn spill<W: Put + ?Sized>(&mut self, x: &[u8], out: &mut W) {
        self.flush(out);
        let buf = self.buf.as_mut();
        let small = x.len() < buf.len() / 2;
        match buf.get_mut(..x.len()) {
            Some(d) if small => {
                d.copy_from_slice(x);
                self.len = x.len();
            }
            _ => out.put(x),
        }
    }

    pub(crate) fn flush<W: Put + ?Sized>(&mut self, out: &mut W) {
        if self.len > 0 {
            out.put(self.buf.as_mut().get(..self.len).unwrap_or(&[]));
            self.len = 0;
        }
    }
}

/// Batches the many small writes of canonical JSON (a brace, a quote, a
/// key) in a buffer: one dynamic call and one large write into the
/// caller's sink (e.g. a streaming hasher) per kilobyte instead of per
/// token.
pub(crate) struct Stage<'p> {
    st: Staging<&'p mut [u8]>,
    out: &'p mut dyn Put,
}

impl<'p> Stage<'p> {
    fn new(buf: &'p mut [u8], out: &'p mut dyn Put) -> Self {
        Stage {
            st: Staging::new(buf),
            out,
        }
    }

    #[inline]
    fn put(&mut self, x: &[u8]) {
        self.st.put(x, self.out);
    }

    fn flush(&mut self) {
        self.st.flush(self.out);
    }
}

/// Re-escapes a decoded string as serde_json's serializer does.
struct Escaper<'s, 'p>(&'s mut Stage<'p>);
impl StrOut for Escaper<'_, '_> {
    #[inline]
    fn raw(&mut self, seg: &[u8]) {
        self.0.put(seg);
    }
    fn esc(&mut self, ch: &[u8]) {
        match ch {
            [b'"'] => self.0.put(b"\\\""),
            [b'\\'] => self.0.put(b"\\\\"),
            [0x08] => self.0.put(b"\\b"),
            [0x09] => self.0.put(b"\\t"),
            [0x0a] => self.0.put(b"\\n"),
            [0x0c] => self.0.put(b"\\f"),
            [0x0d] => self.0.put(b"\\r"),
            [c] if *c < 0x20 => {
                const D: &[u8; 16] = b"0123456789abcdef";
                let hi = D.get(usize::from(*c >> 4)).copied().unwrap_or(b'0');
                let lo = D.get(usize::from(*c & 0xf)).copied().unwrap_or(b'0');
                self.0.put(&[b'\\', b'u', b'0', b'0', hi, lo]);
            }
            _ => self.0.put(ch),
        }
    }
}

/// Whether a number token prints as itself in serde_json (an integer that
/// fits u64 or i64, other than `-0`).
pub(crate) fn number_is_plain(tok: &[u8]) -> bool {
    let digits = match tok.split_first() {
        Some((b'-', rest)) => {
            if rest == b"0" || rest.len() > 18 {
                return false;
            }
            rest
        }
        _ => {
            if tok.len() > 19 {
                return false;
            }
            tok
        }
    };
    !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
}

fn number_value(tok: &[u8], at: usize) -> Res<serde_json::Number> {
    match serde_json::from_slice::<serde_json::Number>(tok) {
        Ok(n) => Ok(n),
        Err(_) => fail(at, "number out of range"),
    }
}

/// Write a number token as serde_json prints its parsed value.
fn put_number(tok: &[u8], at: usize, out: &mut Stage) -> Res<()> {
    if number_is_plain(tok) {
        out.put(tok);
        return Ok(());
    }
    let n = number_value(tok, at)?;
    let mut cur = std::io::Cursor::new([0u8; 48]);
    if serde_json::to_writer(&mut cur, &n).is_err() {
        return fail(at, "number out of range");
    }
    let len = cur.position() as usize;
    out.put(cur.get_ref().get(..len).unwrap_or(&[]));
    Ok(())
}

/// Canonical JSON of a value (object keys sorted bytewise after decoding,
/// duplicate keys keeping the last, `cache_control` keys dropped, no
/// whitespace, strings escaped as serde_json does), exactly as
/// `extract::write_canonical_json(&serde_json::from_str(value))`, with the
/// same errors (serde's checks of strings and numbers, its recursion limit).
///
/// Two passes over the value: the first validates it and records, for each
/// object whose members must be reordered, their key offsets in sorted
/// order; the second writes. Scratch memory is reused across values and is
/// at most a few bytes per object member of the value.
#[derive(Debug, Default)]
pub struct Canon {
    tape: Tape,
    /// The two passes' stacks (kept to spare their initialization per value).
    ix: Vec<IxFrame>,
    em: Vec<EmFrame>,
    /// The buffer of [`Stage`] (allocated at the first value).
    stage: Vec<u8>,
    /// The budget values are charged to (unlimited by default).
    pub work: Work,
}

/// The first pass's record: which objects to write in another order.
#[derive(Debug, Default)]
struct Tape {
    /// Key offsets of the members of the open objects (first pass).
    members: Vec<u32>,
    /// Per reordered object: start, end, member count, key offsets.
    blocks: Arena,
    /// Block positions, sorted by object start.
    index: Vec<u32>,
    /// Where in `index` the last lookup found its block.
    hint: std::cell::Cell<usize>,
}

const ARENA_CHUNK: usize = 4096;

/// Push, growing the capacity by half (not double) when full.
#[inline]
fn push_slow_growth(v: &mut Vec<u32>, x: u32) {
    if v.len() == v.capacity() {
        v.reserve_exact(v.len() / 2 + 64);
    }
    v.push(x);
}

/// Marks a block in the large format.
const LARGE: u32 = u32::MAX;

/// Whether a member count fits the small block format (15 bits).
fn n_kept_fits(n: usize) -> bool {
    n < 0x8000
}

/// A growable array of u32 in fixed chunks: growing never copies or holds
/// two buffers at once, and the slack is at most one chunk.
#[derive(Debug, Default)]
struct Arena {
    chunks: Vec<Vec<u32>>,
    len: usize,
}

impl Arena {
    fn clear(&mut self) {
        self.chunks.truncate(1);
        if let Some(c) = self.chunks.first_mut() {
            c.clear();
        }
        self.len = 0;
    }

    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, x: u32) {
        let c = self.len / ARENA_CHUNK;
        if c == self.chunks.len() {
            self.chunks.push(Vec::with_capacity(ARENA_CHUNK));
        }
        if let Some(ch) = self.chunks.get_mut(c) {
            ch.push(x);
            self.len += 1;
        }
    }

    fn get(&self, pos: usize) -> Option<u32> {
        self.chunks
            .get(pos / ARENA_CHUNK)?
            .get(pos % ARENA_CHUNK)
            .copied()
    }
}

/// A frame of the first pass.
#[derive(Debug, Clone, Copy, Default)]
struct IxFrame {
    obj: bool,
    start: u32,
    base: u32,
}

/// A frame of the second pass.
#[derive(Debug, Clone, Copy)]
enum EmFrame {
    Arr,
    /// Members in body order; `written`: one was written.
    Stream {
        written: bool,
    },
    /// Members from `blocks[pos..]`; `k` of `n` written; `end`: after `}`.
    Block {
        pos: u32,
        k: u32,
        n: u32,
        end: u32,
    },
}

const CACHE_CONTROL: &[u8] = b"cache_control";

impl Canon {
    /// Bytes of scratch memory held.
    pub fn capacity_bytes(&self) -> usize {
        let t = &self.tape;
        (t.members.capacity() + t.index.capacity() + t.blocks.chunks.len() * ARENA_CHUNK) * 4
    }

    /// Write the canonical JSON of the value at `i` (its first byte, after
    /// whitespace) into `out`. Returns the index after the value and, if the
    /// value is an object, the offset of the value of its last `type` key.
    pub fn write<P: Put>(
        &mut self,
        b: &[u8],
        i: usize,
        out: &mut P,
    ) -> Res<(usize, Option<usize>)> {
        self.write_dyn(b, i, out)
    }

    fn write_dyn(&mut self, b: &[u8], i: usize, out: &mut dyn Put) -> Res<(usize, Option<usize>)> {
        if b.len() > u32::MAX as usize {
            return fail(0, "body too large");
        }
        let Canon {
            tape,
            ix,
            em,
            stage,
            work,
        } = self;
        if stage.len() < STAGE {
            stage.resize(STAGE, 0);
        }
        let mut out = Stage::new(stage, out);
        let r = Self::write_staged(tape, ix, em, work, b, i, &mut out);
        out.flush();
        r
    }

    fn write_staged(
        tape: &mut Tape,
        ix: &mut Vec<IxFrame>,
        em: &mut Vec<EmFrame>,
        work: &mut Work,
        b: &[u8],
        i: usize,
        out: &mut Stage,
    ) -> Res<(usize, Option<usize>)> {
        if !matches!(b.get(i), Some(b'[' | b'{')) {
            return Ok((scalar(b, i, out)?, None));
        }
        tape.members.clear();
        tape.blocks.clear();
        tape.index.clear();
        tape.hint.set(0);
        if ix.len() < MAX_DEPTH {
            ix.resize(MAX_DEPTH, IxFrame::default());
        }
        let (end, ty) = tape.index_value(b, i, ix, work)?;
        let blocks = &tape.blocks;
        tape.index
            .sort_unstable_by_key(|&p| blocks.get(p as usize).unwrap_or(0));
        if em.len() < MAX_DEPTH {
            em.resize(MAX_DEPTH, EmFrame::Arr);
        }
        tape.emit(b, i, out, em)?;
        Ok((end, ty))
    }
}

/// Canonical JSON of the scalar at `i` (checked as serde parses it).
fn scalar(b: &[u8], i: usize, out: &mut Stage) -> Res<usize> {
    match b.get(i) {
        Some(b'"') => {
            out.put(b"\"");
            let j = decode_str(b, i + 1, true, &mut Escaper(out))?;
            out.put(b"\"");
            Ok(j)
        }
        Some(b'-' | b'0'..=b'9') => {
            let j = skip_number(b, i)?;
            put_number(b.get(i..j).unwrap_or(&[]), i, out)?;
            Ok(j)
        }
        Some(b'n') => {
            out.put(b"null");
            skip_lit(b, i, b"null")
        }
        Some(b't') => {
            out.put(b"true");
            skip_lit(b, i, b"true")
        }
        Some(b'f') => {
            out.put(b"false");
            skip_lit(b, i, b"false")
        }
        Some(_) => fail(i, "expected value"),
        None => fail(i, "EOF while parsing a value"),
    }
}

impl Tape {
    /// Record a key at `q` of an open object (validating it); returns the
    /// index of the member's value (after `:`).
    fn key(&mut self, b: &[u8], q: usize) -> Res<usize> {
        push_slow_growth(&mut self.members, q as u32);
        colon(b, decode_str_fast(b, q + 1, true, &mut NoOut)?)
    }

    /// First pass: validate, and index the objects to reorder.
    fn index_value(
        &mut self,
        b: &[u8],
        i: usize,
        stack: &mut [IxFrame],
        work: &mut Work,
    ) -> Res<(usize, Option<usize>)> {
        let mut d = 0usize;
        let mut ty = None;
        let mut i = i;
        loop {
            i = ws(b, i);
            work.charge(cost::CANON, i)?;
            match b.get(i) {
                Some(b'"') => i = decode_str(b, i + 1, true, &mut NoOut)?,
                Some(b'-' | b'0'..=b'9') => {
                    let j = skip_number_fast(b, i)?;
                    let tok = b.get(i..j).unwrap_or(&[]);
                    // A lone digit is plain.
                    if j > i + 1 && !number_is_plain(tok) {
                        number_value(tok, i)?;
                    }
                    i = j;
                }
                Some(b'n') => i = skip_lit(b, i, b"null")?,
                Some(b't') => i = skip_lit(b, i, b"true")?,
                Some(b'f') => i = skip_lit(b, i, b"false")?,
                Some(&c @ (b'[' | b'{')) => {
                    let Some(slot) = stack.get_mut(d) else {
                        return fail(i, "recursion limit exceeded");
                    };
                    let obj = c == b'{';
                    *slot = IxFrame {
                        obj,
                        start: i as u32,
                        base: self.members.len() as u32,
                    };
                    d += 1;
                    let start = i;
                    i = ws(b, i + 1);
                    match (b.get(i), obj) {
                        (Some(b']'), false) => {
                            i += 1;
                            d -= 1;
                        }
                        (Some(b'}'), true) => {
                            i += 1;
                            d -= 1;
                        }
                        (Some(b'"'), true) => {
                            if d == 1 && str_is(b, i, b"type") {
                                ty =
                                    Some(ws(b, colon(b, decode_str(b, i + 1, true, &mut NoOut)?)?));
                            }
                            i = self.key(b, i)?;
                            continue;
                        }
                        (Some(_), true) => return fail(i, "key must be a string"),
                        (Some(_), false) => continue,
                        (None, _) => return fail(start, "EOF while parsing a value"),
                    }
                }
                Some(_) => return fail(i, "expected value"),
                None => return fail(i, "EOF while parsing a value"),
            }
            // A value ended.
            loop {
                let Some(top) = d.checked_sub(1).and_then(|t| stack.get(t)).copied() else {
                    return Ok((i, ty));
                };
                i = ws(b, i);
                match b.get(i) {
                    Some(b',') => {
                        i = ws(b, i + 1);
                        if top.obj {
                            if b.get(i) != Some(&b'"') {
                                return fail(i, "key must be a string");
                            }
                            if d == 1 && str_is(b, i, b"type") {
                                ty =
                                    Some(ws(b, colon(b, decode_str(b, i + 1, true, &mut NoOut)?)?));
                            }
                            i = self.key(b, i)?;
                        }
                        break;
                    }
                    Some(b']') if !top.obj => {
                        i += 1;
                        d -= 1;
                    }
                    Some(b'}') if top.obj => {
                        i += 1;
                        d -= 1;
                        // Sorting m keys: m levels of comparisons per key
                        // at most log2(m) + 1 deep.
                        let m = (self.members.len() as u64).saturating_sub(u64::from(top.base));
                        if m >= 2 {
                            work.charge(cost::SORT * m * u64::from(m.ilog2() + 1), i)?;
                        }
                        self.close_object(b, top.start, top.base as usize, i);
                    }
                    _ => return fail(i, "expected `,` or end of container"),
                }
            }
        }
    }

    /// An object's members are known: record their order if it is not the
    /// body's (fewer than two members never need it: a lone `cache_control`
    /// is dropped while writing).
    fn close_object(&mut self, b: &[u8], start: u32, base: usize, end: usize) {
        const DROPPED: u32 = u32::MAX;
        let Some(ms) = self.members.get_mut(base..) else {
            return;
        };
        if ms.len() >= 2 {
            // Two members (the commonest reordered object): one comparison
            // orders them and tells a duplicate (they are in body order).
            let mut pair_dup = false;
            if let [x, y] = ms {
                match cmp_str(b, *x as usize, *y as usize) {
                    Ordering::Greater => std::mem::swap(x, y),
                    Ordering::Equal => pair_dup = true,
                    Ordering::Less => {}
                }
            } else {
                ms.sort_unstable_by(|&x, &y| cmp_str(b, x as usize, y as usize).then(x.cmp(&y)));
            }
            let pair = ms.len() == 2;
            // Keep the last of equal keys, drop cache_control.
            let mut in_order = true;
            let mut prev_kept: Option<u32> = None;
            let mut kept = 0u32;
            for k in 0..ms.len() {
                let Some(&off) = ms.get(k) else { break };
                let dup_next = if pair {
                    k == 0 && pair_dup
                } else {
                    ms.get(k + 1)
                        .is_some_and(|&nx| cmp_str(b, off as usize, nx as usize) == Ordering::Equal)
                };
                if dup_next || str_is(b, off as usize, CACHE_CONTROL) {
                    in_order = false;
                    if let Some(m) = ms.get_mut(k) {
                        *m = DROPPED;
                    }
                    continue;
                }
                if prev_kept.is_some_and(|p| p > off) {
                    in_order = false;
                }
                prev_kept = Some(off);
                kept += 1;
            }
            if !in_order {
                // Block: start; then, if the object is shorter than 64 KiB,
                // one word of span and count and the key offsets relative to
                // the start two to a word; else a flag word, end, count and
                // the offsets as they are.
                push_slow_growth(&mut self.index, self.blocks.len() as u32);
                self.blocks.push(start);
                let span = (end as u32).saturating_sub(start);
                let keep = ms.iter().filter(|&&o| o != DROPPED);
                if span <= 0xFFFF && n_kept_fits(kept as usize) {
                    self.blocks.push(span | kept << 16);
                    let mut pair: Option<u32> = None;
                    for &off in keep {
                        let rel = off.saturating_sub(start);
                        match pair.take() {
                            None => pair = Some(rel),
                            Some(lo) => self.blocks.push(lo | rel << 16),
                        }
                    }
                    if let Some(lo) = pair {
                        self.blocks.push(lo);
                    }
                } else {
                    self.blocks.push(LARGE);
                    self.blocks.push(end as u32);
                    self.blocks.push(kept);
                    for &off in keep {
                        self.blocks.push(off);
                    }
                }
            }
        }
        self.members.truncate(base);
    }

    /// The end (after `}`) and member count of the block at `pos`.
    fn block_head(&self, pos: u32) -> (u32, u32) {
        let p = pos as usize;
        let start = self.blocks.get(p).unwrap_or(0);
        match self.blocks.get(p + 1).unwrap_or(0) {
            LARGE => (
                self.blocks.get(p + 2).unwrap_or(0),
                self.blocks.get(p + 3).unwrap_or(0),
            ),
            w => (start + (w & 0xFFFF), w >> 16),
        }
    }

    /// The key offset of member `k` of the block at `pos`.
    fn block_member(&self, pos: u32, k: u32) -> Option<usize> {
        let (p, k) = (pos as usize, k as usize);
        let start = self.blocks.get(p)?;
        match self.blocks.get(p + 1)? {
            LARGE => self.blocks.get(p + 4 + k).map(|o| o as usize),
            _ => {
                let w = self.blocks.get(p + 2 + k / 2)?;
                let rel = if k % 2 == 0 { w & 0xFFFF } else { w >> 16 };
                Some((start + rel) as usize)
            }
        }
    }

    fn block_of(&self, start: usize) -> Option<u32> {
        let at = |k: usize| {
            self.index
                .get(k)
                .filter(|&&p| self.blocks.get(p as usize) == Some(start as u32))
                .copied()
        };
        // Objects in an array are met in the order of the index.
        let h = self.hint.get();
        if let Some(p) = at(h + 1) {
            self.hint.set(h + 1);
            return Some(p);
        }
        if let Some(p) = at(h) {
            return Some(p);
        }
        let k = self
            .index
            .binary_search_by_key(&Some(start as u32), |&p| self.blocks.get(p as usize))
            .ok()?;
        self.hint.set(k);
        self.index.get(k).copied()
    }

    /// Write `"key":` for the key at `q`; returns the index of its value.
    fn put_key(b: &[u8], q: usize, out: &mut Stage) -> Res<usize> {
        out.put(b"\"");
        let j = decode_str_fast(b, q + 1, true, &mut Escaper(out))?;
        out.put(b"\":");
        colon(b, j)
    }

    /// Next member of a streamed object: `i` is after `{` (`at_start`) or
    /// after a member's value. Writes `,` (if a member was `written`) and
    /// `"key":`, and returns the index of the member's value; or None at `}`
    /// (then `i` is after it). Skips `cache_control` members.
    fn next_streamed(
        b: &[u8],
        i: &mut usize,
        at_start: bool,
        written: &mut bool,
        out: &mut Stage,
    ) -> Res<Option<usize>> {
        let mut at_start = at_start;
        loop {
            let mut j = ws(b, *i);
            match b.get(j) {
                Some(b'}') => {
                    *i = j + 1;
                    return Ok(None);
                }
                Some(b',') if !at_start => j = ws(b, j + 1),
                _ if at_start => {}
                _ => return fail(j, "expected `,` or `}`"),
            }
            if b.get(j) != Some(&b'"') {
                return fail(j, "key must be a string");
            }
            if str_is(b, j, CACHE_CONTROL) {
                let v = colon(b, decode_str(b, j + 1, true, &mut NoOut)?)?;
                *i = fast_skip(b, v)?;
                at_start = false;
                continue;
            }
            if *written {
                out.put(b",");
            }
            *written = true;
            return Ok(Some(Self::put_key(b, j, out)?));
        }
    }

    /// Second pass: write.
    fn emit(&self, b: &[u8], i: usize, out: &mut Stage, stack: &mut [EmFrame]) -> Res<usize> {
        let mut d = 0usize;
        let mut i = i;
        loop {
            // Write the value at i.
            i = ws(b, i);
            let mut opened = false;
            match b.get(i) {
                Some(b'"') => {
                    out.put(b"\"");
                    i = decode_str(b, i + 1, true, &mut Escaper(out))?;
                    out.put(b"\"");
                }
                Some(b'-' | b'0'..=b'9') => {
                    let j = skip_number_fast(b, i)?;
                    let tok = b.get(i..j).unwrap_or(&[]);
                    if j == i + 1 {
                        // A lone digit prints as itself.
                        out.put(tok);
                    } else {
                        put_number(tok, i, out)?;
                    }
                    i = j;
                }
                Some(b'n') => {
                    i = skip_lit(b, i, b"null")?;
                    out.put(b"null");
                }
                Some(b't') => {
                    i = skip_lit(b, i, b"true")?;
                    out.put(b"true");
                }
                Some(b'f') => {
                    i = skip_lit(b, i, b"false")?;
                    out.put(b"false");
                }
                Some(b'[') => {
                    out.put(b"[");
                    let j = ws(b, i + 1);
                    if b.get(j) == Some(&b']') {
                        out.put(b"]");
                        i = j + 1;
                    } else {
                        let Some(slot) = stack.get_mut(d) else {
                            return fail(i, "recursion limit exceeded");
                        };
                        *slot = EmFrame::Arr;
                        d += 1;
                        i = j;
                        opened = true;
                    }
                }
                Some(b'{') => {
                    out.put(b"{");
                    let Some(slot) = stack.get_mut(d) else {
                        return fail(i, "recursion limit exceeded");
                    };
                    match self.block_of(i) {
                        Some(pos) => {
                            let (end, n) = self.block_head(pos);
                            match self.block_member(pos, 0) {
                                Some(q) if n > 0 => {
                                    *slot = EmFrame::Block { pos, k: 1, n, end };
                                    d += 1;
                                    i = Self::put_key(b, q, out)?;
                                    opened = true;
                                }
                                _ => {
                                    out.put(b"}");
                                    i = end as usize;
                                }
                            }
                        }
                        None => {
                            let mut written = false;
                            let mut j = i + 1;
                            match Self::next_streamed(b, &mut j, true, &mut written, out)? {
                                Some(v) => {
                                    *slot = EmFrame::Stream { written };
                                    d += 1;
                                    i = v;
                                    opened = true;
                                }
                                None => {
                                    out.put(b"}");
                                    i = j;
                                }
                            }
                        }
                    }
                }
                Some(_) => return fail(i, "expected value"),
                None => return fail(i, "EOF while parsing a value"),
            }
            if opened {
                continue;
            }
            // A value ended: advance in its container.
            loop {
                let Some(t) = d.checked_sub(1) else {
                    return Ok(i);
                };
                let Some(top) = stack.get_mut(t) else {
                    return fail(i, "internal");
                };
                match top {
                    EmFrame::Arr => {
                        i = ws(b, i);
                        match b.get(i) {
                            Some(b',') => {
                                out.put(b",");
                                i += 1;
                                break;
                            }
                            Some(b']') => {
                                out.put(b"]");
                                i += 1;
                                d -= 1;
                            }
                            _ => return fail(i, "expected `,` or `]`"),
                        }
                    }
                    EmFrame::Stream { written } => {
                        match Self::next_streamed(b, &mut i, false, written, out)? {
                            Some(v) => {
                                i = v;
                                break;
                            }
                            None => {
                                out.put(b"}");
                                d -= 1;
                            }
                        }
                    }
                    EmFrame::Block { pos, k, n, end } => {
                        if *k < *n {
                            let q = self.block_member(*pos, *k);
                            *k += 1;
                            let Some(q) = q else {
                                return fail(i, "internal");
                            };
                            out.put(b",");
                            i = Self::put_key(b, q, out)?;
                            break;
                        }
                        out.put(b"}");
                        i = *end as usize;
                        d -= 1;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// `key_word` agrees with decoding into a `SmallOut` wherever it
    /// answers, and answers for every short plain key.
    #[test]
    fn key_word_matches_decoding() {
        let keys: [&[u8]; 9] = [
            b"",
            b"a",
            b"role",
            b"content",
            b"messages",
            b"tool_call_id",
            b"fifteen_bytes_k",
            b"sixteen_bytes_ke",
            b"caf\\u00e9",
        ];
        for k in keys {
            for tail in [&b":1}   more bytes to fill"[..], b""] {
                let mut body = vec![b'"'];
                body.extend_from_slice(k);
                body.push(b'"');
                body.extend_from_slice(tail);
                for utf8 in [false, true] {
                    let got = key_word(&body, 1, utf8);
                    let mut out = SmallOut::new();
                    let end = decode_str(&body, 1, utf8, &mut out).unwrap();
                    let plain = k.len() < 16 && !k.contains(&b'\\') && body.len() >= 17;
                    assert_eq!(got.is_some(), plain, "{:?}", String::from_utf8_lossy(k));
                    if let Some((w, e)) = got {
                        assert_eq!((w, e), (word_of(out.get().unwrap()), end));
                    }
                }
            }
        }
        // Not ASCII: answered only when the bytes are known to be UTF-8.
        let body = "\"caf\u{e9}\":1, and more bytes".as_bytes();
        assert_eq!(key_word(body, 1, false), None);
        assert_eq!(key_word(body, 1, true).map(|x| x.1), Some(7));
        // A control byte or an unterminated key: never.
        assert_eq!(key_word(b"\"ro\nle\":1, and more bytes", 1, true), None);
        assert_eq!(key_word(b"\"role and more bytes", 1, true), None);
    }

    proptest! {
        /// The bit stack behaves as a stack of booleans.
        #[test]
        fn frames_is_a_stack(ops in proptest::collection::vec(0u8..3, 0..2000)) {
            let mut f = Frames::default();
            let mut model: Vec<bool> = Vec::new();
            for op in ops {
                match op {
                    0 | 1 => {
                        f.push(op == 1);
                        model.push(op == 1);
                    }
                    _ => {
                        f.pop();
                        model.pop();
                    }
                }
                prop_assert_eq!(f.len, model.len());
                prop_assert_eq!(f.top_is_obj(), model.last().copied().unwrap_or(false));
            }
        }

        /// The string scanner stops where a bytewise scan stops.
        #[test]
        fn scan_special_matches_bytewise(data in proptest::collection::vec(
            prop_oneof![Just(b'a'), Just(b'"'), Just(b'\\'), Just(0x1f), Just(0x20), Just(0x7f), Just(0x80), Just(0xff), any::<u8>()],
            0..100), start in 0usize..100) {
            let start = start.min(data.len());
            let (j, hi) = scan_special(&data, start);
            let want = data[start..].iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20).map_or(data.len(), |p| start + p);
            prop_assert_eq!(j, want);
            if data[start..j].iter().any(|&c| c >= 0x80) {
                prop_assert!(hi);
            }
        }
    }

    fn json_str() -> impl Strategy<Value = String> {
        proptest::collection::vec(
            prop_oneof![
                Just("a"),
                Just("b"),
                Just("!"),
                Just(" "),
                Just("~"),
                Just("é"),
                Just("\\u0061"),
                Just("\\\""),
                Just("\\n"),
                Just("\\u00e9"),
                Just("\\ud83d\\ude00"),
                Just("😀"),
                Just("cache_control"),
                Just("cache\\u005fcontrol")
            ],
            0..5,
        )
        .prop_map(|v| format!("\"{}\"", v.concat()))
    }

    proptest! {
        /// Comparing strings in place agrees with comparing their decoded
        /// bytes.
        #[test]
        fn cmp_str_and_str_is_decode(x in json_str(), y in json_str()) {
            let body = format!("{x}{y}");
            let b = body.as_bytes();
            let dec = |q: usize| {
                let mut v = Vec::new();
                decode_str(b, q + 1, true, &mut v).map(|_| v)
            };
            let (Ok(dx), Ok(dy)) = (dec(0), dec(x.len())) else {
                return Ok(());
            };
            prop_assert_eq!(cmp_str(b, 0, x.len()), dx.cmp(&dy));
            prop_assert_eq!(str_is(b, 0, b"cache_control"), dx == b"cache_control");
            prop_assert_eq!(str_is(b, x.len(), b"a"), dy == b"a");
        }
    }

    #[test]
    fn streaming_part_hash_equals_one_shot() {
        for n in [0usize, 1, 16, 17, 128, 129, 239, 240, 241, 1000, 5000] {
            let data: Vec<u8> = (0..n).map(|i| (i * 7 % 251) as u8).collect();
            let mut h = xxhash_rust::xxh3::Xxh3::with_seed(crate::hash::PART_SEED);
            for c in data.chunks(37) {
                h.update(c);
            }
            assert_eq!(
                h.digest(),
                crate::hash::hash(&data, crate::hash::PART_SEED),
                "{n}"
            );
        }
    }
}
