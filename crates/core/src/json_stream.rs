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
#[inline(always)]
pub fn ws(b: &[u8], i: usize) -> usize {
    // None, or one byte (`", "`, `": "`), inline.
    match b.get(i) {
        Some(b' ' | b'\n' | b'\t' | b'\r') => match b.get(i + 1) {
            Some(b' ' | b'\n' | b'\t' | b'\r') => ws_run(b, i + 2),
            _ => i + 1,
        },
        _ => i,
    }
}

/// [`ws`] after two whitespace bytes: up to 7 more a byte a step, then 8
/// bytes a step (a long run of whitespace costs about what a string's
/// bytes cost, not a loop a byte).
#[inline(never)]
fn ws_run(b: &[u8], mut i: usize) -> usize {
    const LOW: u64 = !HIGH;
    // High bit of each byte of `v` that is not 0 (exact, no carries).
    let nonzero = |v: u64| ((v & LOW).wrapping_add(LOW) | v) & HIGH;
    let end = i + 7;
    while let Some(b' ' | b'\n' | b'\t' | b'\r') = b.get(i) {
        i += 1;
        if i == end {
            break;
        }
    }
    if i < end {
        return i;
    }
    while let Some(c) = b.get(i..).and_then(|r| r.first_chunk::<8>()) {
        let w = u64::from_le_bytes(*c);
        let other = nonzero(w ^ (ONES * u64::from(b' ')))
            & nonzero(w ^ (ONES * u64::from(b'\n')))
            & nonzero(w ^ (ONES * u64::from(b'\t')))
            & nonzero(w ^ (ONES * u64::from(b'\r')));
        if other != 0 {
            return i + (other.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
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

/// Four hex digits at `i`, checked and decoded without a branch a digit
/// (random hex digits, as in CJK text, would mispredict); None if they
/// are not four hex digits (then [`hex4`] tells the error).
#[inline(always)]
fn hex4_fast(b: &[u8], i: usize) -> Option<u32> {
    let c = b.get(i..)?.first_chunk::<4>()?;
    let x = u32::from_le_bytes(*c);
    const H: u32 = 0x8080_8080;
    const B: u32 = 0x0101_0101;
    // Bytes below 0x80, so adding at most 0x80 to each carries into none.
    let l = x | (B * 0x20);
    let digit = x.wrapping_add(B * 0x50) & !x.wrapping_add(B * 0x46);
    let letter = l.wrapping_add(B * 0x1f) & !l.wrapping_add(B * 0x19);
    if x & H != 0 || (digit | letter) & H != H {
        return None;
    }
    // A digit's low nibble, plus 9 for a letter (bit 6 set).
    let n = (x & (B * 0x0f)) + ((x >> 6) & B) * 9;
    let p = ((n & 0x000f_000f) << 4) | ((n >> 8) & 0x000f_000f);
    Some(((p & 0xff) << 8) | ((p >> 16) & 0xff))
}

/// The escapes' short forms: the byte a `\x` escape stands for (0: not a
/// short escape; `u` is not one).
#[allow(clippy::indexing_slicing)] // evaluated at compile time
const SHORT_ESC: [u8; 256] = {
    let mut t = [0u8; 256];
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t[b'/' as usize] = b'/';
    t[b'b' as usize] = 0x08;
    t[b'f' as usize] = 0x0c;
    t[b'n' as usize] = b'\n';
    t[b'r' as usize] = b'\r';
    t[b't' as usize] = b'\t';
    t
};

/// How many bytes a dense loop looks ahead for the next stop.
const AHEAD: usize = 32;

/// The first stop (`"`, `\` or a control byte) among the [`AHEAD`] bytes
/// at `i`: its offset, and whether a byte >= 0x80 may come before it (never
/// false when one does). None if there is none or fewer bytes are left. No
/// branch on where the stop is.
#[inline(always)]
fn stop_ahead(b: &[u8], i: usize) -> Option<(usize, bool)> {
    let c = b.get(i..)?.first_chunk::<AHEAD>()?;
    let (x, y) = c.split_at(16);
    let (u, v) = (u128_of(x), u128_of(y));
    let mask =
        |w: u128| u128::from(stop_mask(w as u64)) | u128::from(stop_mask((w >> 64) as u64)) << 64;
    let (mu, mv) = (mask(u), mask(v));
    // The lowest bit of each is exact (see `stop_mask`).
    let at = if mu != 0 {
        mu.trailing_zeros()
    } else {
        128 + mv.trailing_zeros()
    };
    if at >= 256 {
        return None;
    }
    let high = u128::from(HIGH) | u128::from(HIGH) << 64;
    let hi = if mu != 0 {
        u & high & (mu - 1) != 0
    } else {
        (u | (v & (mv - 1))) & high != 0
    };
    Some(((at / 8) as usize, hi))
}

#[inline(always)]
fn u128_of(c: &[u8]) -> u128 {
    match c.first_chunk::<16>() {
        Some(a) => u128::from_le_bytes(*a),
        None => 0,
    }
}

/// Skip the rest of a string (`i` just after the opening quote), as serde's
/// `ignore_str`; with `utf8`, its bytes must also be UTF-8 (a `RawValue`).
/// Returns the index after the closing quote.
#[inline]
pub fn skip_str(b: &[u8], i: usize, utf8: bool) -> Res<usize> {
    Ok(skip_str_counted(b, i, utf8, u64::MAX)?.0)
}

/// [`skip_str`], also returning what the string's escapes are charged
/// ([`cost::ESCAPE`] each, [`cost::ESCAPE_U`] a `\u` one); stops with
/// [`TOO_COMPLEX`] once that is over `max`.
#[inline]
pub fn skip_str_counted(b: &[u8], i: usize, utf8: bool, max: u64) -> Res<(usize, u64)> {
    match short_str(b, i) {
        Some(end) => Ok((end, 0)),
        None => skip_str_at::<true>(b, i, utf8, max),
    }
}

/// The rest of a string (`i` just after its opening quote) if it is short
/// ASCII without escapes (a key, a short value): the index after its
/// closing quote, found in one step.
#[inline(always)]
fn short_str(b: &[u8], i: usize) -> Option<usize> {
    let c = b.get(i..)?.first_chunk::<8>()?;
    let w = u64::from_le_bytes(*c);
    let m = stop_mask(w);
    if m == 0 {
        return None;
    }
    let at = (m.trailing_zeros() / 8) as usize;
    (c.get(at) == Some(&b'"') && w & HIGH & (m - 1) == 0).then_some(i + at + 1)
}

/// [`skip_str`] of the string whose opening quote is at `q`, its escapes
/// charged to `work` (stopping early once they are over it).
#[inline]
pub fn skip_str_charged(b: &[u8], q: usize, utf8: bool, work: &mut Work) -> Res<usize> {
    if let Some(end) = short_str(b, q + 1) {
        return Ok(end);
    }
    let (end, n) = skip_str_at::<true>(b, q + 1, utf8, work.left())?;
    work.charge(n, q)?;
    Ok(end)
}

/// [`skip_str_counted`] out of line.
/// `DENSE` false: without [`skip_dense`] (the tests' reference).
fn skip_str_at<const DENSE: bool>(b: &[u8], i: usize, utf8: bool, max: u64) -> Res<(usize, u64)> {
    let start = i;
    let mut i = i;
    let mut hi = false;
    let mut charge = 0u64;
    loop {
        let (j, h) = scan_special(b, i);
        hi |= h;
        if charge > max {
            return fail(j, TOO_COMPLEX);
        }
        match b.get(j) {
            Some(b'"') => {
                if utf8 && hi && std::str::from_utf8(b.get(start..j).unwrap_or(&[])).is_err() {
                    return fail(start, "invalid unicode code point");
                }
                return Ok((j + 1, charge));
            }
            Some(b'\\') => {
                // The escapes that follow at short gaps, in one loop;
                // anything else (an error included) is left to this one.
                let k = if DENSE {
                    skip_dense(b, j, &mut hi, &mut charge, max)
                } else {
                    j
                };
                if k != j {
                    i = k;
                    continue;
                }
                match b.get(j + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => {
                        charge += cost::ESCAPE_CUT + cost::ESCAPE;
                        i = j + 2
                    }
                    Some(b'u') => {
                        charge += cost::ESCAPE_CUT + cost::ESCAPE_U;
                        i = hex4(b, j + 2)?.1
                    }
                    Some(_) => return fail(j + 1, "invalid escape"),
                    None => return fail(j + 1, "EOF while parsing a string"),
                }
            }
            Some(_) => return fail(j, "control character in string"),
            None => return fail(j, "EOF while parsing a string"),
        }
    }
}

/// From the escape at `j`: escapes and the short gaps between them (less
/// than [`AHEAD`] bytes), skipped in one loop without a scan a gap; charged to
/// `charge` (stopping once it is over `max`). Returns where it stopped:
/// at a backslash, quote or control byte it leaves to the caller (an
/// escape it does not take: invalid, or too near the end), or after an
/// escape followed by a long gap.
#[inline(always)]
fn skip_dense(b: &[u8], j: usize, hi: &mut bool, charge: &mut u64, max: u64) -> usize {
    let mut j = j;
    // The scan that found the first escape stopped there.
    let mut cut = cost::ESCAPE_CUT;
    loop {
        if *charge > max {
            return j;
        }
        let Some(&e) = b.get(j + 1) else {
            return j;
        };
        let next = if SHORT_ESC.get(usize::from(e)).is_some_and(|&c| c != 0) {
            *charge += cut + cost::ESCAPE;
            j + 2
        } else if e == b'u' && hex4_fast(b, j + 2).is_some() {
            *charge += cut + cost::ESCAPE_U;
            j + 6
        } else {
            return j;
        };
        // A run of escapes: no scan.
        if b.get(next) == Some(&b'\\') {
            j = next;
            cut = 0;
            continue;
        }
        match stop_ahead(b, next) {
            Some((at, h)) if b.get(next + at) == Some(&b'\\') => {
                *hi |= h;
                j = next + at;
                cut = cost::ESCAPE_GAP;
            }
            _ => return next,
        }
    }
}

/// Where decoded string bytes go: `raw` segments are copied from the body
/// (never `"`, `\` or a control byte), `esc` is one character decoded from
/// an escape.
pub trait StrOut {
    /// A run of bytes as written in the body; or a run of escapes and the
    /// short segments between them, decoded and gathered (with
    /// [`StrOut::ESCAPES`], the characters `esc` re-escapes go to `esc`).
    fn raw(&mut self, seg: &[u8]);
    /// The UTF-8 of one escaped character.
    fn esc(&mut self, ch: &[u8]);
    /// `esc` writes a character re-escaped as serde_json's serializer
    /// does, not its UTF-8.
    const ESCAPES: bool = false;
}

/// The UTF-8 of `c` (a scalar value) as the low bytes of a little-endian
/// word, and how many.
#[inline(always)]
fn utf8_word(c: u32) -> (u64, usize) {
    let c = u64::from(c);
    let cont = |k: u32| 0x80 | ((c >> (6 * k)) & 0x3f);
    if c < 0x80 {
        (c, 1)
    } else if c < 0x800 {
        ((0xC0 | c >> 6) | cont(0) << 8, 2)
    } else if c < 0x1_0000 {
        ((0xE0 | c >> 12) | cont(1) << 8 | cont(0) << 16, 3)
    } else {
        let w = (0xF0 | c >> 18) | cont(2) << 8 | cont(1) << 16 | cont(0) << 24;
        (w, 4)
    }
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
    decode_str_at::<O, true>(b, i, utf8_known, out)
}

#[inline]
/// `DENSE` false: without [`decode_dense`] (the tests' reference).
fn decode_str_at<O: StrOut, const DENSE: bool>(
    b: &[u8],
    i: usize,
    utf8_known: bool,
    out: &mut O,
) -> Res<usize> {
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
            Some(b'\\') => {
                // The escapes that follow at short gaps, in one loop;
                // anything else (an error included) is left to this one.
                let k = if DENSE {
                    decode_dense(b, j, utf8_known, out)
                } else {
                    j
                };
                i = if k != j {
                    k
                } else {
                    decode_escape(b, j + 1, out)?
                };
            }
            Some(_) => return fail(j, "control character in string"),
            None => return fail(j, "EOF while parsing a string"),
        }
    }
}

/// [`skip_dense`] decoding: from the escape at `j`, escapes and the short
/// gaps between them (less than [`AHEAD`] bytes; with `utf8_known` false, ASCII)
/// are gathered in a small buffer and written with one [`StrOut::raw`] a
/// buffer. Returns where it stopped: at a backslash, quote or control byte
/// it leaves to the caller (an escape it does not take: invalid, a
/// surrogate, or too near the end), or after an escape followed by a long
/// gap. Writes what it took.
#[inline(always)]
fn decode_dense<O: StrOut>(b: &[u8], j: usize, utf8_known: bool, out: &mut O) -> usize {
    let mut buf = [0u8; DENSE_BUF];
    let mut j = j;
    loop {
        let (next, p, full) = dense_fill(b, j, utf8_known, &mut buf);
        let got = buf.get(..p).unwrap_or(&[]);
        if O::ESCAPES {
            // Decoded: what serde re-escapes (`"`, `\` and control bytes)
            // goes through `esc`, one character each.
            let mut k = 0;
            for (i, &c) in got.iter().enumerate() {
                if c < 0x20 || c == b'"' || c == b'\\' {
                    if i > k {
                        out.raw(got.get(k..i).unwrap_or(&[]));
                    }
                    out.esc(&[c]);
                    k = i + 1;
                }
            }
            if got.len() > k {
                out.raw(got.get(k..).unwrap_or(&[]));
            }
        } else if p > 0 {
            out.raw(got);
        }
        if !full {
            return next;
        }
        j = next;
    }
}

/// What [`dense_fill`] gathers before it is written: [`DENSE_CAP`], and
/// room past it for an escape's word and a gap's bytes.
const DENSE_CAP: usize = 96;
const DENSE_BUF: usize = DENSE_CAP + 8 + AHEAD;

/// [`decode_dense`]'s loop, out of line (the sinks share it): fills
/// `buf` with the UTF-8 of the escapes and gaps from the escape at `j`;
/// returns where it stopped, the bytes gathered, and whether it stopped
/// because `buf` is full (then at the next escape to take).
#[inline(never)]
fn dense_fill(
    b: &[u8],
    j: usize,
    utf8_known: bool,
    buf: &mut [u8; DENSE_BUF],
) -> (usize, usize, bool) {
    let mut p = 0usize;
    let mut j = j;
    loop {
        let Some(&e) = b.get(j + 1) else {
            return (j, p, false);
        };
        let short = SHORT_ESC.get(usize::from(e)).copied().unwrap_or(0);
        let (w, n, next) = if short != 0 {
            let (w, n) = utf8_word(u32::from(short));
            (w, n, j + 2)
        } else if e == b'u' {
            match hex4_fast(b, j + 2) {
                Some(c) if !(0xD800..=0xDFFF).contains(&c) => {
                    let (w, n) = utf8_word(c);
                    (w, n, j + 6)
                }
                Some(c) if c < 0xDC00 && b.get(j + 6..j + 8) == Some(b"\\u") => {
                    // A surrogate pair.
                    match hex4_fast(b, j + 8) {
                        Some(d) if (0xDC00..=0xDFFF).contains(&d) => {
                            let (w, n) = utf8_word(0x1_0000 + ((c - 0xD800) << 10) + (d - 0xDC00));
                            (w, n, j + 12)
                        }
                        _ => return (j, p, false),
                    }
                }
                _ => return (j, p, false),
            }
        } else {
            return (j, p, false);
        };
        if let Some(d) = buf.get_mut(p..p + 8) {
            d.copy_from_slice(&w.to_le_bytes());
        }
        p += n;
        if b.get(next) == Some(&b'\\') {
            // A run of escapes: no scan.
            j = next;
        } else {
            match stop_ahead(b, next) {
                Some((at, h)) if b.get(next + at) == Some(&b'\\') && (utf8_known || !h) => {
                    let gap = (buf.get_mut(p..p + AHEAD), b.get(next..next + AHEAD));
                    if let (Some(d), Some(g)) = gap {
                        d.copy_from_slice(g);
                    }
                    p += at;
                    j = next + at;
                }
                _ => return (next, p, false),
            }
        }
        if p > DENSE_CAP {
            return (j, p, true);
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
    /// What is left of the budget.
    #[inline]
    pub fn left(&self) -> u64 {
        self.0
    }

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
    /// A message's content written next after its role (`,"content":`),
    /// taken without the member walk, in either pass.
    pub const HEAD: u64 = 5;
    /// A message, in each pass.
    pub const MESSAGE: u64 = 3;
    /// An object content part walked for its text (second pass).
    pub const PART: u64 = 20;
    /// A marker of a non-text part whose hex is memoized.
    pub const MARKER: u64 = 10;
    /// A marker's hash and hex when not memoized.
    pub const HASH: u64 = 20;
    /// A value of canonical JSON (checked and written; with its key).
    pub const CANON: u64 = 9;
    /// Whitespace in canonical JSON (where its copy of the body is cut).
    pub const GAP: u64 = 3;
    /// An escape in a string (`\n`, `\"`...), met by the first pass
    /// (decoding it again in the second, and in canonical JSON, included),
    /// in a run of escapes: 524k `\n` in a row cost 2.0 ns each.
    pub const ESCAPE: u64 = 3;
    /// A `\uXXXX` escape, likewise: 175k random CJK ones in a row cost 4.5
    /// ns each (a surrogate pair is two).
    pub const ESCAPE_U: u64 = 5;
    /// Added for an escape after a gap of text of less than 32 bytes (the
    /// next escape found without a scan): 7-10 ns measured on gaps of 1-6
    /// bytes (pasted CSV, JSON in strings), 17-18 on German prose's gaps
    /// of 1-31 (1 MiB bodies: a mispredicted branch costs more out of L2;
    /// 18 since the decoding loop is out of line).
    pub const ESCAPE_GAP: u64 = 18;
    /// Added instead for an escape that stopped a scan of the string (after
    /// a longer gap, or the string's first): 33 ns measured (1 MiB of text
    /// with `\r\n` every 40-80 bytes).
    pub const ESCAPE_CUT: u64 = 33;
    /// Canonical JSON's re-escaping of a string, per two bytes from its
    /// first escape that serde writes otherwise (`\/`, `\uXXXX`) to its
    /// end: 1.6 ns an escape measured for 175k `\u00e9` in a tool's
    /// description (on top of the first pass's charges). Escapes before
    /// it are kept as written, charged [`ESCAPE`] each: 524k `\n` there
    /// cost 4.4 ns each in all, charged 6.
    pub const CANON_ESCAPED: u64 = 3;
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
            Some(b'"') => i = skip_str_charged(b, i, utf8, &mut st.work)?,
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
                        i = colon(b, skip_str_charged(b, i, utf8, &mut st.work)?)?;
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
                            Some(b'"') => {
                                i = colon(b, skip_str_charged(b, i, utf8, &mut st.work)?)?
                            }
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
    const ESCAPES: bool = true;
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

/// Canonical JSON of a value: object members in body order (duplicates
/// kept), `cache_control` members dropped (Anthropic cache hints do not
/// change what the model sees), no whitespace, strings escaped and numbers
/// printed as serde_json does; with serde_json's errors for the value (its
/// checks of strings and numbers, its recursion limit).
///
/// One streaming pass: the value is written as it is read, so after an
/// error part of it may have been written (the extractor then discards the
/// whole stream). Scratch memory: a stack of at most 127 frames and the
/// 1 KiB staging buffer, reused across values.
#[derive(Debug, Default)]
pub struct Canon {
    /// Open containers: (is an object, a member of it was written).
    stack: Vec<(bool, bool)>,
    /// The buffer of [`Stage`] (allocated at the first value).
    stage: Vec<u8>,
    /// The budget values are charged to (unlimited by default).
    pub work: Work,
}

const CACHE_CONTROL: &[u8] = b"cache_control";

/// Output that goes nowhere (a dropped member, still checked).
struct Discard;
impl Put for Discard {
    fn put(&mut self, _: &[u8]) {}
}

impl Canon {
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
        let Canon { stack, stage, work } = self;
        if stage.len() < STAGE {
            stage.resize(STAGE, 0);
        }
        let mut out = Stage::new(stage, out);
        let r = Self::emit(b, i, &mut out, stack, work, 0);
        out.flush();
        r
    }

    /// The pass: write each value as it is read (`base` containers are
    /// open around it, `stack` holds those it opens).
    ///
    /// Canonical JSON shares most of its bytes with the body: all but
    /// whitespace, escapes, numbers serde prints otherwise, and dropped
    /// members (with their commas). Those are copied in runs ([`Runs`]): a
    /// compact value without escapes is one copy, whatever its elements;
    /// each element is still checked as serde checks it and charged to
    /// `work`.
    fn emit(
        b: &[u8],
        i: usize,
        out: &mut Stage,
        stack: &mut Vec<(bool, bool)>,
        work: &mut Work,
        base: usize,
    ) -> Res<(usize, Option<usize>)> {
        stack.clear();
        let mut ty = None;
        let mut r = Runs {
            run: i,
            out,
            gaps: 0,
        };
        let mut i = i;
        'value: loop {
            // The value at i.
            i = r.gap(b, i);
            work.charge(cost::CANON + cost::GAP * std::mem::take(&mut r.gaps), i)?;
            match b.get(i) {
                Some(b'"') => i = r.string(b, i, work)?,
                Some(b'-' | b'0'..=b'9') => {
                    let j = skip_number_fast(b, i)?;
                    let tok = b.get(i..j).unwrap_or(&[]);
                    if j != i + 1 && !number_is_plain(tok) {
                        r.cut(b, i);
                        put_number(tok, i, r.out)?;
                        r.run = j;
                    }
                    i = j;
                }
                Some(b'n') => i = skip_lit(b, i, b"null")?,
                Some(b't') => i = skip_lit(b, i, b"true")?,
                Some(b'f') => i = skip_lit(b, i, b"false")?,
                Some(&c @ (b'[' | b'{')) => {
                    // serde counts a container against its recursion limit
                    // even when it is empty.
                    if base + stack.len() >= MAX_DEPTH {
                        return fail(i, "recursion limit exceeded");
                    }
                    if c == b'[' {
                        i = r.gap(b, i + 1);
                        if b.get(i) == Some(&b']') {
                            i += 1;
                        } else {
                            stack.push((false, false));
                            continue 'value;
                        }
                    } else {
                        stack.push((true, false));
                        i += 1;
                        match Self::member(b, &mut i, None, &mut r, stack, work, base, &mut ty)? {
                            Member::Value(v) => {
                                i = v;
                                continue 'value;
                            }
                            Member::Dropped => {}
                            Member::End => _ = stack.pop(),
                        }
                    }
                }
                Some(_) => return fail(i, "expected value"),
                None => return fail(i, "EOF while parsing a value"),
            }
            // A value ended: advance in its container.
            loop {
                let Some(&(obj, _)) = stack.last() else {
                    r.cut(b, i);
                    work.charge(cost::GAP * r.gaps, i)?;
                    return Ok((i, ty));
                };
                i = r.gap(b, i);
                match (obj, b.get(i)) {
                    (true, Some(b',')) => {
                        // Written only before a written member: kept in the
                        // run while that may be so (see `member`).
                        let comma = i;
                        i += 1;
                        if !written(stack) || is_ws(b, i) {
                            r.cut(b, comma);
                            r.run = i;
                        }
                        let m = Self::member(
                            b,
                            &mut i,
                            Some(comma),
                            &mut r,
                            stack,
                            work,
                            base,
                            &mut ty,
                        )?;
                        match m {
                            Member::Value(v) => {
                                i = v;
                                continue 'value;
                            }
                            Member::Dropped => {}
                            Member::End => _ = stack.pop(),
                        }
                    }
                    (true, Some(b'}')) | (false, Some(b']')) => {
                        i += 1;
                        stack.pop();
                    }
                    (false, Some(b',')) => {
                        i += 1;
                        continue 'value;
                    }
                    (true, _) => return fail(i, "expected `,` or `}`"),
                    (false, _) => return fail(i, "expected `,` or `]`"),
                }
            }
        }
    }

    /// The next member of the object on top of `stack`: `i` is after its
    /// `{` (`comma` None) or after a member's `,` (at `comma`). Writes its
    /// key (and the comma, if a member was written before) and returns
    /// where its value starts; or, at `}`, [`Member::End`] (`i` after it).
    /// A `cache_control` member is checked as any value, without output,
    /// and [`Member::Dropped`] (`i` after it): the caller goes on as after
    /// a value, where a comma that follows stays unwritten until a member
    /// is. Notes in `ty` where the value of the outermost object's last
    /// `type` key starts.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn member(
        b: &[u8],
        i: &mut usize,
        comma: Option<usize>,
        r: &mut Runs,
        stack: &mut [(bool, bool)],
        work: &mut Work,
        base: usize,
        ty: &mut Option<usize>,
    ) -> Res<Member> {
        let depth = stack.len();
        let j = r.gap(b, *i);
        match b.get(j) {
            Some(b'"') => {}
            Some(b'}') if comma.is_none() => {
                *i = j + 1;
                return Ok(Member::End);
            }
            _ => return fail(j, "key must be a string"),
        }
        let fast = key_word(b, j + 1, true);
        let cc = match fast {
            Some((w, _)) => w == CACHE_CONTROL_W,
            None => str_is(b, j, CACHE_CONTROL),
        };
        // The comma is still in the run (not written yet).
        let held = comma.filter(|&c| r.run <= c);
        if cc {
            r.cut(b, held.unwrap_or(j));
            let v = colon(b, decode_str(b, j + 1, true, &mut NoOut)?)?;
            let (mut buf, mut discard) = ([0u8; 64], Discard);
            let mut none = Stage::new(&mut buf, &mut discard);
            *i = Self::emit(b, v, &mut none, &mut Vec::new(), work, base + depth)?.0;
            r.run = *i;
            return Ok(Member::Dropped);
        }
        if comma.is_some() && held.is_none() && written(stack) {
            r.cut(b, j);
            r.out.put(b",");
        }
        if let Some(top) = stack.last_mut() {
            top.1 = true;
        }
        let (is_type, e) = match fast {
            Some((w, e)) => (w == TYPE_W, e),
            None => (str_is(b, j, b"type"), r.string(b, j, work)?),
        };
        let k = r.gap(b, e);
        match b.get(k) {
            Some(b':') => {}
            Some(_) => return fail(k, "expected `:`"),
            None => return fail(k, "EOF while parsing an object"),
        }
        if depth == 1 && is_type {
            *ty = Some(ws(b, k + 1));
        }
        Ok(Member::Value(k + 1))
    }
}

/// What [`Canon::member`] met.
enum Member {
    /// A member whose value starts here (its key written).
    Value(usize),
    /// A dropped `cache_control` member.
    Dropped,
    /// The object's `}`.
    End,
}

/// JSON whitespace at `i`.
#[inline(always)]
fn is_ws(b: &[u8], i: usize) -> bool {
    matches!(b.get(i), Some(b' ' | b'\n' | b'\t' | b'\r'))
}

/// Whether the object on top of `stack` has a written member.
fn written(stack: &[(bool, bool)]) -> bool {
    stack.last().is_some_and(|t| t.1)
}

/// `cache_control` and `type` as [`key_word`] reads them.
const CACHE_CONTROL_W: u128 = word_of(CACHE_CONTROL);
const TYPE_W: u128 = word_of(b"type");

/// Canonical JSON's output in runs of the body: the bytes from `run` to
/// the value being read are canonical as they stand and not written yet.
struct Runs<'o, 'p> {
    run: usize,
    out: &'o mut Stage<'p>,
    /// Runs cut by whitespace since the last charge.
    gaps: u64,
}

impl Runs<'_, '_> {
    /// Write the pending run, up to `i`.
    #[inline]
    fn cut(&mut self, b: &[u8], i: usize) {
        if i > self.run {
            self.out.put(b.get(self.run..i).unwrap_or(&[]));
        }
        self.run = i;
    }

    /// Whitespace at `i` ends the run and is skipped; returns the index
    /// after it.
    #[inline(always)]
    fn gap(&mut self, b: &[u8], i: usize) -> usize {
        if is_ws(b, i) {
            self.cut(b, i);
            self.gaps += 1;
            self.run = ws(b, i);
            return self.run;
        }
        i
    }

    /// The string whose opening quote is at `q` (checked as serde's
    /// `parse_str`, its bytes known to be UTF-8): part of the run as far
    /// as its escapes are those serde writes (`\n`, `\"`...); from the
    /// first other one (`\/`, `\uXXXX`) decoded and written as serde
    /// escapes. Returns the index after it. Each escape kept is charged to
    /// `work` ([`cost::ESCAPE`]), re-escaping [`cost::CANON_ESCAPED`].
    #[inline(always)]
    fn string(&mut self, b: &[u8], q: usize, work: &mut Work) -> Res<usize> {
        let (mut j, _) = scan_special(b, q + 1);
        // Escapes serde writes as they are stay in the run: a source
        // file's string is copied, not decoded and re-escaped (a coding
        // agent's files in tool_result parts: 1.5x faster).
        while b.get(j) == Some(&b'\\')
            && matches!(
                b.get(j + 1),
                Some(b'"' | b'\\' | b'n' | b'r' | b't' | b'b' | b'f')
            )
        {
            work.charge(cost::ESCAPE, j)?;
            j = scan_special(b, j + 2).0;
        }
        if b.get(j) == Some(&b'"') {
            return Ok(j + 1);
        }
        self.cut(b, j);
        let end = decode_str(b, j, true, &mut Escaper(self.out))?;
        // `as` is exact: a span of the body.
        work.charge((end - j) as u64 * cost::CANON_ESCAPED / 2, j)?;
        // The closing quote starts the next run.
        self.run = end - 1;
        Ok(end)
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

        /// Whitespace is skipped to where a bytewise skip stops, long runs
        /// (8 bytes a step) included.
        #[test]
        fn ws_matches_bytewise(data in proptest::collection::vec(
            prop_oneof![12 => Just(b' '), 8 => Just(b'\n'), 8 => Just(b'\t'), 8 => Just(b'\r'),
                1 => Just(0x0b), 1 => Just(0x0c), 1 => Just(0x00), 1 => Just(0x21), 1 => Just(0xa0),
                1 => any::<u8>()], 0..80),
            at in 0usize..80) {
            let naive = data.iter().skip(at).position(|c| !b" \n\t\r".contains(c))
                .map_or(data.len().max(at), |k| at + k);
            prop_assert_eq!(ws(&data, at), naive);
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
        /// Matching strings in place agrees with their decoded bytes.
        #[test]
        fn str_is_decodes(x in json_str(), y in json_str()) {
            let body = format!("{x}{y}");
            let b = body.as_bytes();
            let dec = |q: usize| {
                let mut v = Vec::new();
                decode_str(b, q + 1, true, &mut v).map(|_| v)
            };
            let (Ok(dx), Ok(dy)) = (dec(0), dec(x.len())) else {
                return Ok(());
            };
            prop_assert_eq!(str_is(b, 0, b"cache_control"), dx == b"cache_control");
            prop_assert_eq!(str_is(b, x.len(), b"a"), dy == b"a");
        }
    }

    /// Strings dense in escapes (runs of them, short and long gaps,
    /// invalid ones, surrogates, control and non-UTF-8 bytes, near the end
    /// of the body): the fast paths agree with serde_json on what is
    /// accepted, the decoded bytes, the error and canonical JSON.
    fn dense_str() -> impl Strategy<Value = Vec<u8>> {
        let frag = prop_oneof![
            Just(&b"a"[..]),
            Just(&b"abcdefghijklmnopq"[..]),
            Just(&b"abc def"[..]),
            Just("\u{e9}".as_bytes()),
            Just("\u{4e2d}\u{6587}".as_bytes()),
            Just(&b"\\n"[..]),
            Just(&b"\\r\\n"[..]),
            Just(&b"\\\""[..]),
            Just(&b"\\\\"[..]),
            Just(&b"\\/"[..]),
            Just(&b"\\b\\f\\t"[..]),
            Just(&b"\\u00e9"[..]),
            Just(&b"\\u4E2d"[..]),
            Just(&b"\\uFfFf"[..]),
            Just(&b"\\u0000\\u0001\\u001F\\u007f"[..]),
            Just(&b"\\u0022\\u005C\\u002f"[..]),
            Just(&b"\\ud83d\\ude00"[..]),
            Just(&b"\\ud83d"[..]),
            Just(&b"\\udc00"[..]),
            Just(&b"\\u12"[..]),
            Just(&b"\\u12g4"[..]),
            Just(&b"\\u:0@0"[..]),
            Just(&b"\\x"[..]),
            Just(&b"\\"[..]),
            Just(&b"\x01"[..]),
            Just(&b"\xff"[..]),
            Just(&b"\xc3"[..]),
        ];
        (
            proptest::collection::vec(frag, 0..24),
            any::<bool>(),
            0usize..20,
        )
            .prop_map(|(v, close, pad)| {
                let mut s = vec![b'"'];
                for f in v {
                    s.extend_from_slice(f);
                }
                if close {
                    s.push(b'"');
                }
                s.extend(std::iter::repeat_n(b' ', pad));
                s
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn dense_escapes_match_serde(body in dense_str()) {
            let serde_str = serde_json::from_slice::<String>(&body);
            for utf8_known in [false, true] {
                if utf8_known && std::str::from_utf8(&body).is_err() {
                    continue;
                }
                // As the loop without the fast path: the same bytes, the
                // same error at the same byte.
                let (mut v, mut w) = (Vec::new(), Vec::new());
                let got = decode_str(&body, 1, utf8_known, &mut v);
                let want = decode_str_at::<_, false>(&body, 1, utf8_known, &mut w);
                prop_assert_eq!(got, want);
                if got.is_ok() {
                    prop_assert_eq!(&v, &w);
                }
                // And as serde when it is the whole body.
                if let Ok(end) = got {
                    if ws(&body, end) == body.len() {
                        let s = serde_str.as_ref().map_err(|e| e.to_string());
                        prop_assert_eq!(s.map(|s| s.as_bytes().to_vec()), Ok(v.clone()));
                    }
                }
                let mut small = SmallOut::new();
                let r = decode_str(&body, 1, utf8_known, &mut small);
                prop_assert_eq!(r, got);
                if got.is_ok() {
                    prop_assert_eq!(small.get().map(<[u8]>::to_vec), (v.len() <= 16).then_some(v));
                }
            }
            for utf8 in [false, true] {
                let got = skip_str_counted(&body, 1, utf8, u64::MAX);
                let want = skip_str_at::<false>(&body, 1, utf8, u64::MAX);
                prop_assert_eq!(got.map(|x| x.0), want.map(|x| x.0));
                // The reference charges each escape as one that stops a scan.
                if let (Ok((_, n)), Ok((_, m))) = (got, want) {
                    prop_assert!(n <= m && (n == 0) == (m == 0), "{} {}", n, m);
                }
                // Stopped early: by the same charge, wherever.
                if let Ok((_, n)) = got {
                    if n > 0 {
                        let r = skip_str_counted(&body, 1, utf8, n - 1);
                        prop_assert_eq!(r.map_err(|e| e.what), Err(TOO_COMPLEX));
                    }
                }
            }
            // Canonical JSON of the string: serde's.
            if let Ok(s) = &serde_str {
                let mut out = Vec::new();
                let r = Canon::default().write(&body, 0, &mut out);
                prop_assert!(r.is_ok());
                prop_assert_eq!(out, serde_json::to_vec(s).unwrap_or_default());
            }
        }
    }

    #[test]
    fn hex4_fast_matches_hex4() {
        let digits = b"0123456789abcdefABCDEFgG/:@`\x80\xff ";
        for &p in digits {
            for &q in digits {
                for &r in digits {
                    for &t in digits {
                        let b = [p, q, r, t];
                        let want = hex4(&b, 0).ok().map(|(v, _)| u32::from(v));
                        assert_eq!(hex4_fast(&b, 0), want, "{b:?}");
                    }
                }
            }
        }
        assert_eq!(hex4_fast(b"abc", 0), None);
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
