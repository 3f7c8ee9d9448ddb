//! Prompt extraction: from a request body to the canonical byte stream the
//! model will see, written into a [`PromptSink`].
//!
//! ## Canonical stream
//! The stream depends on what the model sees, not on how the JSON was
//! written: whitespace, escapes, the order of a request's and a message's
//! fields, and Anthropic `cache_control` hints do not change it. Non-text
//! values (tools, tool calls, non-text parts) are re-serialized as
//! canonical JSON ([`crate::json_stream::Canon`]): members in the order
//! they are written, since clients resend them byte for byte each turn.
//! The same conversation sent as turn N and as turn N+1 shares a byte
//! prefix up to the end of turn N, because every record is self-contained
//! and nothing is appended after the last message.
//!
//! Records, in order (`RS` = 0x1E, `US` = 0x1F, `GS` = 0x1D):
//! - tools: `RS "tools" US <canonical JSON>` (chat, responses, messages)
//! - Anthropic `system` / Responses `instructions`: a `system` message
//! - every message: `RS <role> US <content>` then, if present, `US` + field
//!   name + `=` + value for `name`, `tool_call_id`, and canonical `tool_calls`.
//!   `content` is the string itself; an array of parts is its parts joined by
//!   `US`, text parts as their text (so `"hi"` and `[{"type":"text","text":"hi"}]`
//!   give the same bytes) and any other part as the stable marker
//!   `GS <type> GS <16 hex digits of xxh3(canonical JSON of the part)>`.
//! - completions: the prompt string; an array of prompts joined by `RS`;
//!   token-id arrays as little-endian u32s.
//!
//! The model name and an optional `cache_salt` are not in the stream: they
//! seed the hash chain ([`crate::hash::model_seed`]), so two models never share
//! a key.
//!
//! ## Anchor
//! The extractor calls [`PromptSink::anchor`] at the end of the first user
//! message (the opening of a conversation). The routing key uses it; see
//! [`crate::key`].
//!
//! ## Cost
//! No tree: [`extract`] walks the body twice with the byte-level scanner of
//! [`crate::json_stream`]. The first pass ([`Scan`]) checks the whole body
//! exactly as the former `serde_json` extractor did (same accepted bodies,
//! same kind of error) and notes where each top-level field starts; the
//! second walks the fields this API routes on in canonical order (so
//! `tools` after `messages` still comes first) and writes text straight from
//! the body into the sink (escapes decoded on the fly, small writes batched
//! in a 1 KiB buffer). A value is walked again only when its place in
//! the stream is decided by a later field (a message whose `role` follows
//! its `content`, a part whose `type` follows its `text`) or when it is
//! hashed as canonical JSON. [`peek_meta`] is a separate, lighter first pass
//! (the router's); [`Scan`] serves both from one.
//!
//! Memory: no allocation per element. A one-bit-per-level stack for
//! arbitrarily deep ignored values, and for canonical JSON (written in one
//! streaming pass) a stack of at most 127 frames and a 1 KiB staging
//! buffer (`tests/memory.rs` measures the peak per body byte). Time:
//! O(body bytes). Element-heavy bodies still cost more per byte than text
//! (a few ns per element; each non-text part is hashed and adds 22 bytes to
//! the stream; markers of values of at most 7 bytes are memoized by their
//! bytes; see BENCHMARKS.md), which the work budget bounds.
//!
//! Work budget: both passes charge each element they meet its measured
//! native cost ([`crate::json_stream::cost`]: a value skipped 5 ns, a
//! struct member 15, a non-text part's marker 10-30, a value of canonical
//! JSON 9...) against [`budget`]: 20 us plus 0.56 ns a byte, twice what a
//! plain prompt's bytes cost (0.28 ns a byte, not charged: bytes are what
//! every body pays). A body over it stops with
//! [`ExtractError::TooComplex`] (the router then keys it by
//! [`Scan::raw_head`], or counts the fallback `too_complex`), so with its
//! bytes it costs at most about 3x a plain prompt
//! of its size, plus 20 us, whatever its elements are. Charges are counts,
//! not times: every machine and the .wasm decide alike. Legitimate bodies
//! are charged within 0.75 of it (a chat of short turns 0.45 ns a byte,
//! an agent request with 120 tool schemas 0.42; `tests/budget.rs`).
//!
//! Equivalence (bytes, anchor, metadata and error kind) is tested against
//! the former serde extractor, kept in `tests/reference/`
//! (`tests/extract_equiv.rs`).

use std::borrow::Cow;

use crate::hash;
use crate::json_stream::{
    colon, cost, decode_str, fast_skip, key_word, number_is_plain, scan_special, skip_lit,
    skip_number, skip_number_fast, skip_str_charged, skip_str_counted, skip_value, str_is,
    text_part_head, word_of, ws, Canon, Fail, Frames, NoOut, Put, Res, SmallOut, Staging, StrOut,
    Work, STAGE, TOO_COMPLEX,
};

const RS: &[u8] = &[0x1E];
const US: &[u8] = &[0x1F];
const GS: &[u8] = &[0x1D];

/// Which API a handled path speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI `/v1/chat/completions`.
    ChatCompletions,
    /// OpenAI `/v1/completions`.
    Completions,
    /// OpenAI `/v1/responses`.
    Responses,
    /// Anthropic `/v1/messages`.
    Messages,
}

impl Api {
    /// The API of a path, by its last segments (so `/openai/v1/chat/completions`
    /// works too).
    pub fn from_path(path: &str) -> Option<Api> {
        let p = path.trim_end_matches('/');
        if p.ends_with("/chat/completions") {
            Some(Api::ChatCompletions)
        } else if p.ends_with("/completions") {
            Some(Api::Completions)
        } else if p.ends_with("/responses") {
            Some(Api::Responses)
        } else if p.ends_with("/messages") {
            Some(Api::Messages)
        } else {
            None
        }
    }

    /// Whether the body has message structure (and so an anchor).
    pub fn structured(self) -> bool {
        !matches!(self, Api::Completions)
    }
}

/// Where the canonical stream goes. The extractor may split and batch
/// writes differently from one version to the next: a sink must depend only
/// on the concatenated bytes and the position of the anchor.
pub trait PromptSink {
    /// Next bytes of the canonical stream.
    fn write(&mut self, bytes: &[u8]);
    /// The end of the first user message (called at most once).
    fn anchor(&mut self);
    /// The start of the first user message (called at most once, before
    /// its bytes): what came before it is the preamble (tools, system
    /// prompt, earlier non-user messages).
    fn user_start(&mut self) {}
}

impl PromptSink for Vec<u8> {
    fn write(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    fn anchor(&mut self) {}
}

/// What the body says besides the prompt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestMeta<'a> {
    /// The `model` field ("" if absent).
    pub model: Cow<'a, str>,
    /// The OpenAI `user` field (or Anthropic `metadata.user_id`).
    pub user: Option<Cow<'a, str>>,
    /// vLLM's `cache_salt`.
    pub cache_salt: Option<Cow<'a, str>>,
}

/// The two fields that seed the hash chain, read before extraction by
/// [`peek_meta`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Meta<'a> {
    /// The `model` field ("" if absent).
    pub model: Cow<'a, str>,
    /// vLLM's `cache_salt`.
    pub cache_salt: Option<Cow<'a, str>>,
}

/// Why a body could not be extracted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtractError {
    /// Not JSON, or not the shape this API expects.
    Parse(String),
    /// Valid, but there is no prompt to route on.
    EmptyPrompt,
    /// More work than the body's budget ([`budget`]): elements too dense
    /// for its size. At the byte where the budget ran out.
    TooComplex(usize),
}

impl std::fmt::Display for ExtractError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExtractError::Parse(m) => write!(f, "parse error: {m}"),
            ExtractError::EmptyPrompt => write!(f, "no prompt in the request"),
            ExtractError::TooComplex(at) => {
                write!(f, "body too complex: work budget spent at byte {at}")
            }
        }
    }
}

#[cold]
fn perr(e: Fail) -> ExtractError {
    if e.what == TOO_COMPLEX {
        return ExtractError::TooComplex(e.at);
    }
    ExtractError::Parse(format!("{} at byte {}", e.what, e.at))
}

/// Extraction's work budget for a body of `len` bytes, in the ns of
/// [`crate::json_stream::cost`]: [`WORK_BASE_NS`] plus [`WORK_NS_PER_KIB`]
/// a KiB.
pub fn budget(len: usize) -> u64 {
    WORK_BASE_NS.saturating_add((len as u64).saturating_mul(WORK_NS_PER_KIB) / 1024)
}

/// Budget for any body: 20 us (a 32 KiB agent request with twelve tool
/// schemas is charged 17 us; a 1 MiB plain prompt costs about 290 us).
pub const WORK_BASE_NS: u64 = 20_000;
/// Budget per KiB of body: 0.56 ns a byte, twice a plain prompt's 0.28
/// (with the bytes themselves, 3x).
pub const WORK_NS_PER_KIB: u64 = 575;

/// A struct's fields: how many (for the array form) and their names as
/// [`word_of`] words (a field's number is its place here).
#[derive(Clone, Copy)]
struct Fields {
    count: usize,
    names: &'static [u128],
}

impl Fields {
    /// The field a key names, the key given as [`key_word`] gives it.
    #[inline]
    fn id(self, key: u128) -> Option<usize> {
        self.names.iter().position(|&n| n == key)
    }
}

/// Fields of a request body, numbered in the order a body written as a JSON
/// array gives them (serde reads a struct from an array positionally).
const BODY_FIELDS: Fields = Fields {
    count: 11,
    names: &[
        word_of(b"model"),
        word_of(b"messages"),
        word_of(b"tools"),
        word_of(b"functions"),
        word_of(b"prompt"),
        word_of(b"instructions"),
        word_of(b"input"),
        word_of(b"system"),
        word_of(b"metadata"),
        word_of(b"user"),
        word_of(b"cache_salt"),
    ],
};
const F_MODEL: usize = 0;
const F_MESSAGES: usize = 1;
const F_TOOLS: usize = 2;
const F_FUNCTIONS: usize = 3;
const F_PROMPT: usize = 4;
const F_INSTRUCTIONS: usize = 5;
const F_INPUT: usize = 6;
const F_SYSTEM: usize = 7;
/// Holds `metadata.user_id`.
const F_METADATA: usize = 8;
const F_USER: usize = 9;
const F_CACHE_SALT: usize = 10;

/// Fields of a message (chat, Anthropic, Responses input item).
const MESSAGE_FIELDS: Fields = Fields {
    count: 6,
    names: &[
        word_of(b"type"),
        word_of(b"role"),
        word_of(b"content"),
        word_of(b"name"),
        word_of(b"tool_calls"),
        word_of(b"tool_call_id"),
    ],
};
const M_TYPE: usize = 0;
const M_ROLE: usize = 1;
const M_CONTENT: usize = 2;
const M_NAME: usize = 3;
const M_TOOL_CALLS: usize = 4;
const M_TOOL_CALL_ID: usize = 5;

const PART_FIELDS: Fields = Fields {
    count: 2,
    names: &[word_of(b"type"), word_of(b"text")],
};
/// The router's former pre-pass struct.
const PEEK_FIELDS: Fields = Fields {
    count: 2,
    names: &[word_of(b"model"), word_of(b"cache_salt")],
};
const META_FIELDS: Fields = Fields {
    count: 1,
    names: &[word_of(b"user_id")],
};

/// The members of a struct-typed value, as serde reads a derived struct:
/// from an object (keys decoded and checked, unknown keys ignored, a known
/// key twice is an error) or from an array (fields by position, no more
/// elements than fields).
struct Members {
    names: Fields,
    seq: bool,
    first: bool,
    k: usize,
    seen: u32,
    /// The member `next` returned repeats a field (an error, unless
    /// `allow_dup`: then the caller decides).
    dup: bool,
    allow_dup: bool,
    /// Where the next member (or the end) is looked for.
    i: usize,
    utf8_known: bool,
    /// What the escapes of the keys read so far are charged (see
    /// [`Members::charge`]), and how much that may be before the walk stops
    /// (the budget left).
    esc: u64,
    max_esc: u64,
}

impl Members {
    #[inline]
    fn open(b: &[u8], i: usize, names: Fields, utf8_known: bool) -> Res<Members> {
        let i = ws(b, i);
        let seq = match b.get(i) {
            Some(b'{') => false,
            Some(b'[') => true,
            Some(_) => return fail(i, "invalid type: expected a struct"),
            None => return fail(i, "EOF while parsing a value"),
        };
        Ok(Members {
            names,
            seq,
            first: true,
            k: 0,
            seen: 0,
            dup: false,
            allow_dup: false,
            i: i + 1,
            utf8_known,
            esc: 0,
            max_esc: u64::MAX,
        })
    }

    /// The next member: its field (None: not a field of the struct) and
    /// where its value starts (possibly at whitespace). None at the end,
    /// then `self.i` is after the closing bracket.
    #[inline]
    fn next(&mut self, b: &[u8]) -> Res<Option<(Option<usize>, usize)>> {
        let close = if self.seq { b']' } else { b'}' };
        let mut j = ws(b, self.i);
        match b.get(j) {
            None => return fail(j, "EOF while parsing a struct"),
            Some(&c) if c == close => {
                self.i = j + 1;
                return Ok(None);
            }
            Some(b',') if !self.first => {
                j = ws(b, j + 1);
                match b.get(j) {
                    Some(&c) if c == close => return fail(j, "trailing comma"),
                    None => return fail(j, "EOF while parsing a value"),
                    _ => {}
                }
            }
            Some(_) if self.first => {}
            Some(_) => return fail(j, "expected `,` or end of struct"),
        }
        self.first = false;
        if self.seq {
            if self.k >= self.names.count {
                return fail(j, "trailing characters");
            }
            self.k += 1;
            return Ok(Some((Some(self.k - 1), j)));
        }
        if b.get(j) != Some(&b'"') {
            return fail(j, "key must be a string");
        }
        let (key, e) = match key_word(b, j + 1, self.utf8_known) {
            Some(x) => x,
            None => {
                // Escapes, a long key, or not known to be UTF-8: decoded.
                // Counted, stopping early past the budget's, before the
                // decode checks it (the budget is charged per member).
                self.esc += skip_str_counted(b, j + 1, false, self.max_esc)?.1;
                let mut key = SmallOut::new();
                let e = decode_str(b, j + 1, self.utf8_known, &mut key)?;
                let w = key
                    .get()
                    .filter(|k| k.len() < 16 && !k.contains(&0))
                    .map_or(0, word_of);
                (w, e)
            }
        };
        // 0 is the empty key, never a field.
        let id = if key == 0 { None } else { self.names.id(key) };
        if let Some(k) = id {
            let bit = 1u32 << k;
            self.dup = self.seen & bit != 0;
            if self.dup && !self.allow_dup {
                return fail(j, "duplicate field");
            }
            self.seen |= bit;
        }
        Ok(Some((id, colon(b, e)?)))
    }

    /// Charge a member (and the escapes of the keys since) to `work`.
    #[inline]
    fn charge(&mut self, work: &mut Work, at: usize) -> Res<()> {
        let n = cost::MEMBER + std::mem::take(&mut self.esc);
        work.charge(n, at)
    }
}

fn fail<T>(at: usize, what: &'static str) -> Res<T> {
    Err(Fail { at, what })
}

/// If a message at `i` opens with its role as clients write it,
/// `{"role":"`: the index of the role's opening quote.
#[inline]
fn role_head(b: &[u8], i: usize) -> Option<usize> {
    (b.get(i..)?.first_chunk::<9>() == Some(br#"{"role":""#)).then_some(i + 8)
}

/// Whether the string at `q` (a role) is `user`.
#[inline]
fn is_user(b: &[u8], q: Option<usize>) -> bool {
    q.is_some_and(|q| match key_word(b, q + 1, true) {
        Some((w, _)) => w == word_of(b"user"),
        None => str_is(b, q, b"user"),
    })
}

/// If a message's role at `e` (after its closing quote) is followed by its
/// content as clients write it, `,"content":`: the index of the content's
/// value.
#[inline]
fn content_head(b: &[u8], e: usize) -> Option<usize> {
    (b.get(e..)?.first_chunk::<11>() == Some(br#","content":"#)).then_some(e + 11)
}

/// `Option<Cow<str>>`: null, or a string (checked as serde's `parse_str`).
/// Returns the end and the string's opening quote.
#[inline]
fn opt_str(b: &[u8], i: usize, utf8_known: bool) -> Res<(usize, Option<usize>)> {
    let i = ws(b, i);
    match b.get(i) {
        Some(b'n') => Ok((skip_lit(b, i, b"null")?, None)),
        Some(b'"') => Ok((decode_str(b, i + 1, utf8_known, &mut NoOut)?, Some(i))),
        Some(_) => fail(i, "invalid type: expected a string"),
        None => fail(i, "EOF while parsing a value"),
    }
}

/// [`opt_str`] in the first pass: the string's escapes charged to `work`
/// (for both passes).
fn opt_str_w(b: &[u8], i: usize, utf8_known: bool, work: &mut Work) -> Res<(usize, Option<usize>)> {
    let i = ws(b, i);
    if b.get(i) != Some(&b'"') {
        return opt_str(b, i, utf8_known);
    }
    // A short plain string (a role, a model) is checked in one step;
    // another is counted (and stopped early) before the decode checks it.
    if let Some((_, e)) = key_word(b, i + 1, utf8_known) {
        return Ok((e, Some(i)));
    }
    skip_str_charged(b, i, false, work)?;
    opt_str(b, i, utf8_known)
}

/// `Option<&RawValue>`: null, or any value whose bytes are UTF-8. Returns
/// the end and where the value starts.
#[inline]
fn opt_raw(b: &[u8], i: usize, st: &mut Frames) -> Res<(usize, Option<usize>)> {
    let i = ws(b, i);
    match b.get(i) {
        Some(b'n') => Ok((skip_lit(b, i, b"null")?, None)),
        Some(_) => Ok((skip_value(b, i, true, st)?, Some(i))),
        None => fail(i, "EOF while parsing a value"),
    }
}

/// `Option<Vec<Message>>` as the request body declares it; `raw` gets the
/// array's `[` and the end of its first user message (its role written
/// `"user"`, without escapes) once the walk has passed it
/// ([`Scan::raw_head`]); `head`: the walk stops there (an error).
fn opt_messages(
    b: &[u8],
    i: usize,
    st: &mut Frames,
    raw: &mut Option<(usize, usize)>,
    head: bool,
) -> Res<(usize, Option<usize>)> {
    let i = ws(b, i);
    match b.get(i) {
        Some(b'n') => return Ok((skip_lit(b, i, b"null")?, None)),
        Some(b'[') => {}
        Some(_) => return fail(i, "invalid type: expected a sequence"),
        None => return fail(i, "EOF while parsing a value"),
    }
    let end = each(b, i, |j| {
        st.work.charge(cost::MESSAGE, j)?;
        if let Some(end) = empty_object(b, j) {
            return Ok(end);
        }
        let mut m = Members::open(b, j, MESSAGE_FIELDS, false)?;
        m.max_esc = st.work.left();
        // The role's opening quote.
        let mut role = None;
        if let Some(q) = role_head(b, j) {
            // The role as clients open a message: taken without the walk.
            role = Some(q);
            m.charge(&mut st.work, q)?;
            m.i = opt_str_w(b, q, false, &mut st.work)?.0;
            (m.first, m.seen) = (false, 1 << M_ROLE);
            if let Some(v) = content_head(b, m.i) {
                // And its content, next as clients write it.
                st.work.charge(cost::HEAD, v)?;
                m.i = opt_raw(b, v, st)?.0;
                m.seen |= 1 << M_CONTENT;
            }
        }
        while let Some((id, v)) = m.next(b)? {
            m.charge(&mut st.work, v)?;
            m.i = match id {
                Some(M_CONTENT | M_TOOL_CALLS) => opt_raw(b, v, st)?.0,
                Some(k) => {
                    let (e, q) = opt_str_w(b, v, false, &mut st.work)?;
                    if k == M_ROLE {
                        role = q;
                    }
                    e
                }
                None => skip_value(b, v, false, st)?,
            };
        }
        // `"user"` as written (an escaped one gives no raw key).
        if raw.is_none() && role.is_some_and(|q| b.get(q + 1..q + 6) == Some(b"user\"")) {
            *raw = Some((i, m.i));
            if head {
                // Ends the walk: the head is all the caller wants (it
                // ignores the error).
                return fail(m.i, "");
            }
        }
        Ok(m.i)
    })?;
    Ok((end, Some(i)))
}

/// `Option<AnthropicMeta>`; returns the end and `user_id`'s opening quote.
fn opt_anthropic_meta(b: &[u8], i: usize, st: &mut Frames) -> Res<(usize, Option<usize>)> {
    let i = ws(b, i);
    if b.get(i) == Some(&b'n') {
        return Ok((skip_lit(b, i, b"null")?, None));
    }
    let mut user_id = None;
    let mut m = Members::open(b, i, META_FIELDS, false)?;
    m.max_esc = st.work.left();
    while let Some((id, v)) = m.next(b)? {
        m.charge(&mut st.work, v)?;
        m.i = match id {
            Some(_) => {
                let (e, s) = opt_str_w(b, v, false, &mut st.work)?;
                user_id = s;
                e
            }
            None => skip_value(b, v, false, st)?,
        };
    }
    Ok((m.i, user_id))
}

/// If `i` is at an empty object `{}` (whitespace allowed inside): the index
/// after it.
#[inline]
fn empty_object(b: &[u8], i: usize) -> Option<usize> {
    if b.get(i) != Some(&b'{') {
        return None;
    }
    let j = ws(b, i + 1);
    (b.get(j) == Some(&b'}')).then_some(j + 1)
}

/// Call `f` with where each element of the array at `i` (its `[`) starts;
/// `f` returns the element's end. Returns the index after `]`.
fn each(b: &[u8], i: usize, mut f: impl FnMut(usize) -> Res<usize>) -> Res<usize> {
    let mut i = i + 1;
    let mut first = true;
    loop {
        let mut j = ws(b, i);
        match b.get(j) {
            Some(b']') => return Ok(j + 1),
            Some(b',') if !first => {
                j = ws(b, j + 1);
                match b.get(j) {
                    Some(b']') => return fail(j, "trailing comma"),
                    None => return fail(j, "EOF while parsing a value"),
                    _ => {}
                }
            }
            Some(_) if first => {}
            Some(_) => return fail(j, "expected `,` or `]`"),
            None => return fail(j, "EOF while parsing a list"),
        }
        first = false;
        i = f(j)?;
    }
}

/// The opening quotes of `model` and `cache_salt` (the pre-pass view).
type Peeked = (Option<usize>, Option<usize>);

/// Where each top-level field's value starts (None: absent or null);
/// `F_METADATA` holds `metadata.user_id`'s.
#[derive(Debug, Default, Clone, Copy)]
struct Top {
    at: [Option<usize>; 11],
}

impl Top {
    fn get(&self, f: usize) -> Option<usize> {
        self.at.get(f).copied().flatten()
    }
}

/// The first pass, over the whole body: its check as the former
/// extractor's request struct (`top`: where each field starts) and, in the
/// same walk, as the router's former pre-pass struct of `model` and
/// `cache_salt` alone (`peek`: their opening quotes). After the first error
/// of one view the walk goes on for the other, checking only syntax.
fn scan(b: &[u8], work: u64, raw: &mut Option<(usize, usize)>) -> (Res<Top>, Res<Peeked>, Work) {
    let mut st = Frames::default();
    st.work = Work(work);
    let mut top = Top::default();
    let (mut body_err, mut peek_err): (Option<Fail>, Option<Fail>) = (None, None);
    let (mut model, mut salt) = (None, None);
    let both = |e: Fail| (Err(e), Err(e), Work(0));
    let mut m = match Members::open(b, 0, BODY_FIELDS, false) {
        Ok(m) => m,
        Err(e) => return both(e),
    };
    m.allow_dup = true;
    m.max_esc = st.work.left();
    loop {
        let (id, v) = match m.next(b) {
            Ok(Some(x)) => x,
            Ok(None) => break,
            Err(e) => return both(e),
        };
        if let Err(e) = m.charge(&mut st.work, v) {
            return both(e);
        }
        if m.dup {
            // A request field twice fails the request view, and the
            // pre-pass view if it is one of its two fields.
            let e = Fail {
                at: v,
                what: "duplicate field",
            };
            body_err.get_or_insert(e);
            if matches!(id, Some(F_MODEL | F_CACHE_SALT)) {
                peek_err.get_or_insert(e);
            }
        }
        // The pre-pass view of this member.
        if peek_err.is_none() {
            let pid = match (m.seq, id) {
                (true, _) => Some(m.k - 1),
                (false, Some(F_MODEL)) => Some(0),
                (false, Some(F_CACHE_SALT)) => Some(1),
                _ => None,
            };
            let r = match pid {
                Some(0) => {
                    let v = ws(b, v);
                    match b.get(v) {
                        Some(b'"') => {
                            decode_str(b, v + 1, false, &mut NoOut).map(|_| model = Some(v))
                        }
                        _ => fail(v, "invalid type: expected a string"),
                    }
                }
                Some(1) => opt_str(b, v, false).map(|(_, q)| salt = q),
                Some(_) => fail(v, "trailing characters"),
                None => Ok(()),
            };
            if let Err(e) = r {
                peek_err = Some(e);
            }
        }
        // The request view.
        let r = match (body_err, id) {
            (Some(_), _) | (None, None) => skip_value(b, v, false, &mut st).map(|e| (e, None)),
            (None, Some(F_MODEL | F_INSTRUCTIONS | F_USER | F_CACHE_SALT)) => {
                opt_str_w(b, v, false, &mut st.work)
            }
            (None, Some(F_MESSAGES)) => opt_messages(b, v, &mut st, raw, false),
            (None, Some(F_INPUT)) => {
                // Responses `input` items, walked as messages as far as
                // their raw head; checked below as any value, as before.
                if raw.is_none() && b.get(ws(b, v)) == Some(&b'[') {
                    let _ = opt_messages(b, v, &mut st, raw, true);
                }
                opt_raw(b, v, &mut st)
            }
            (None, Some(F_METADATA)) => opt_anthropic_meta(b, v, &mut st),
            (None, Some(_)) => opt_raw(b, v, &mut st),
        };
        m.i = match r {
            Ok((end, at)) => {
                if let Some(slot) = id.and_then(|k| top.at.get_mut(k)) {
                    *slot = at;
                }
                end
            }
            Err(e) => {
                body_err = Some(e);
                match skip_value(b, v, false, &mut st) {
                    Ok(end) => end,
                    Err(e) => return both(e),
                }
            }
        };
        if let (Some(x), Some(y)) = (body_err, peek_err) {
            return (Err(x), Err(y), st.work);
        }
    }
    if let Err(e) = end_of_body(b, m.i) {
        return both(e);
    }
    (
        body_err.map_or(Ok(top), Err),
        peek_err.map_or(Ok((model, salt)), Err),
        st.work,
    )
}

fn end_of_body(b: &[u8], i: usize) -> Res<()> {
    let e = ws(b, i);
    if e != b.len() {
        return fail(e, "trailing characters");
    }
    Ok(())
}

/// The string whose opening quote is at `q`, borrowed unless it has escapes.
fn cow_str(b: &[u8], q: usize) -> Res<Cow<'_, str>> {
    let (j, _) = scan_special(b, q + 1);
    if b.get(j) == Some(&b'"') {
        return match std::str::from_utf8(b.get(q + 1..j).unwrap_or(&[])) {
            Ok(s) => Ok(Cow::Borrowed(s)),
            Err(_) => fail(q, "invalid unicode code point"),
        };
    }
    let mut v = Vec::new();
    decode_str(b, q + 1, false, &mut v)?;
    match String::from_utf8(v) {
        Ok(s) => Ok(Cow::Owned(s)),
        Err(_) => fail(q, "invalid unicode code point"),
    }
}

fn opt_cow(b: &[u8], q: Option<usize>) -> Res<Option<Cow<'_, str>>> {
    q.map(|q| cow_str(b, q)).transpose()
}

/// `model` and `cache_salt` of a request body: the fields that seed the hash
/// chain, needed before [`extract`]. Checks the whole body as JSON, with the
/// errors of the router's former pre-pass (`serde_json` reading a struct of
/// just these two fields): a `model` that is not a string, even `null`, is
/// an error; the rest is only checked to be JSON. One pass, no allocation
/// unless a value has escapes. [`Scan`] gives this and [`extract`] from one
/// first pass instead of two.
pub fn peek_meta(body: &[u8]) -> Result<Meta<'_>, ExtractError> {
    let (model, salt) = peek(body).map_err(perr)?;
    Ok(Meta {
        model: opt_cow(body, model).map_err(perr)?.unwrap_or_default(),
        cache_salt: opt_cow(body, salt).map_err(perr)?,
    })
}

/// The pre-pass view alone (everything but `model` and `cache_salt`
/// skipped as ignored values: cheaper than [`scan`]).
fn peek(b: &[u8]) -> Res<Peeked> {
    let mut st = Frames::default();
    let (mut model, mut salt) = (None, None);
    let mut m = Members::open(b, 0, PEEK_FIELDS, false)?;
    while let Some((id, v)) = m.next(b)? {
        m.i = match id {
            Some(0) => {
                let v = ws(b, v);
                if b.get(v) != Some(&b'"') {
                    return fail(v, "invalid type: expected a string");
                }
                model = Some(v);
                decode_str(b, v + 1, false, &mut NoOut)?
            }
            Some(_) => {
                let (e, q) = opt_str(b, v, false)?;
                salt = q;
                e
            }
            None => skip_value(b, v, false, &mut st)?,
        };
    }
    end_of_body(b, m.i)?;
    Ok((model, salt))
}

/// Extract `body` (for `api`) into `sink`; returns the request's metadata.
///
/// On error the sink may have received part of the stream: discard it.
pub fn extract<'a, S: PromptSink>(
    api: Api,
    body: &'a [u8],
    sink: &mut S,
) -> Result<RequestMeta<'a>, ExtractError> {
    Scan::new(body).extract(api, sink)
}

/// A request body after the first pass: [`Scan::meta`] is [`peek_meta`] and
/// [`Scan::extract`] is [`extract`], without walking the body a second time
/// before extraction (the router's `peek_meta` + `extract` walk it three
/// times: twice checking it, once writing the stream).
#[derive(Debug, Clone)]
pub struct Scan<'a> {
    body: &'a [u8],
    top: Res<Top>,
    peek: Res<Peeked>,
    /// The work budget the first pass left to the second.
    work: Work,
    /// `messages`' (or Responses `input`'s) `[` and the end of its first
    /// user message, if the first pass got past it.
    raw: Option<(usize, usize)>,
}

impl<'a> Scan<'a> {
    /// Check `body` (one pass, no allocation for ordinary depths), within
    /// its work [`budget`].
    pub fn new(body: &'a [u8]) -> Scan<'a> {
        Scan::with_budget(body, budget(body.len()))
    }

    /// [`Scan::new`] with a budget of `work` ns for both passes.
    pub fn with_budget(body: &'a [u8], work: u64) -> Scan<'a> {
        let mut raw = None;
        let (top, peek, work) = scan(body, work, &mut raw);
        Scan {
            body,
            top,
            peek,
            work,
            raw,
        }
    }

    /// The `messages` array (Responses: the `input` items) as written,
    /// from its `[` through its first user message (its role written
    /// `"user"`), if the first pass got past it within its budget; and
    /// whether another message follows. What a body over the budget is
    /// keyed by ([`crate::hash::raw_key`]).
    pub fn raw_head(&self) -> Option<(&'a [u8], bool)> {
        let (start, end) = self.raw?;
        let head = self.body.get(start..end)?;
        // A `,` right after the message, as every JSON writer puts it.
        Some((head, self.body.get(end) == Some(&b',')))
    }

    /// As [`peek_meta`].
    pub fn meta(&self) -> Result<Meta<'a>, ExtractError> {
        let (model, salt) = self.peek.map_err(perr)?;
        let b = self.body;
        Ok(Meta {
            model: opt_cow(b, model).map_err(perr)?.unwrap_or_default(),
            cache_salt: opt_cow(b, salt).map_err(perr)?,
        })
    }

    /// As [`extract`].
    pub fn extract<S: PromptSink>(
        &self,
        api: Api,
        sink: &mut S,
    ) -> Result<RequestMeta<'a>, ExtractError> {
        let top = self.top.map_err(perr)?;
        let body = self.body;
        let mut em = Em {
            b: body,
            out: Out {
                sink,
                stage: Staging::new([0; STAGE]),
            },
            canon: Canon::default(),
            part: PartHasher::new(),
            memo: Memo::new(),
            wrote: 0,
            anchored: false,
            user_started: false,
        };
        em.canon.work = self.work;
        let r = em.run(api, &top);
        em.out.flush();
        r.map_err(perr)?;
        if em.wrote == 0 {
            return Err(ExtractError::EmptyPrompt);
        }
        let b = body;
        let meta = match api {
            Api::Messages => RequestMeta {
                model: opt_cow(b, top.get(F_MODEL))
                    .map_err(perr)?
                    .unwrap_or_default(),
                user: opt_cow(b, top.get(F_METADATA)).map_err(perr)?,
                cache_salt: None,
            },
            _ => RequestMeta {
                model: opt_cow(b, top.get(F_MODEL))
                    .map_err(perr)?
                    .unwrap_or_default(),
                user: opt_cow(b, top.get(F_USER)).map_err(perr)?,
                cache_salt: opt_cow(b, top.get(F_CACHE_SALT)).map_err(perr)?,
            },
        };
        Ok(meta)
    }
}

/// Batches small writes to the sink (the stream is the same bytes).
struct Out<'s, S: PromptSink> {
    sink: &'s mut S,
    stage: Staging<[u8; STAGE]>,
}

/// The sink as a [`Put`] for the staging buffer.
struct ToSink<'a, S: PromptSink>(&'a mut S);

impl<S: PromptSink> Put for ToSink<'_, S> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }
}

impl<S: PromptSink> Out<'_, S> {
    #[inline]
    fn put(&mut self, x: &[u8]) {
        self.stage.put(x, &mut ToSink(&mut *self.sink));
    }

    /// `h` as 16 lowercase hex digits, written as two words (not built in
    /// memory and copied: the copy would wait on the partial stores).
    #[inline]
    fn put_hex(&mut self, h: u64) {
        self.put(&hex8((h >> 32) as u32));
        self.put(&hex8(h as u32));
    }

    fn flush(&mut self) {
        self.stage.flush(&mut ToSink(&mut *self.sink));
    }
}

impl<S: PromptSink> Put for Out<'_, S> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        Out::put(self, bytes)
    }
}

impl<S: PromptSink> StrOut for Out<'_, S> {
    #[inline]
    fn raw(&mut self, seg: &[u8]) {
        self.put(seg)
    }
    #[inline]
    fn esc(&mut self, ch: &[u8]) {
        self.put(ch)
    }
}

/// Counts what passes through (to tell an empty string).
struct Counted<'o, O: StrOut>(&'o mut O, usize);
impl<O: StrOut> StrOut for Counted<'_, O> {
    fn raw(&mut self, seg: &[u8]) {
        self.1 += seg.len();
        self.0.raw(seg)
    }
    fn esc(&mut self, ch: &[u8]) {
        self.1 += ch.len();
        self.0.esc(ch)
    }
    const ESCAPES: bool = O::ESCAPES;
}

/// xxh3 of a part's canonical JSON, streaming only past a short buffer.
struct PartHasher {
    small: [u8; 240],
    len: usize,
    big: Option<xxhash_rust::xxh3::Xxh3>,
}

impl PartHasher {
    fn new() -> Self {
        PartHasher {
            small: [0; 240],
            len: 0,
            big: None,
        }
    }
    fn reset(&mut self) {
        self.len = 0;
        self.big = None;
    }
    fn finish(&self) -> u64 {
        match &self.big {
            Some(h) => h.digest(),
            None => hash::hash(self.small.get(..self.len).unwrap_or(&[]), hash::PART_SEED),
        }
    }
}

impl Put for PartHasher {
    fn put(&mut self, x: &[u8]) {
        if let Some(h) = self.big.as_mut() {
            h.update(x);
            return;
        }
        let len = self.len;
        if let Some(d) = self.small.get_mut(len..len + x.len()) {
            d.copy_from_slice(x);
            self.len += x.len();
            return;
        }
        let mut h = xxhash_rust::xxh3::Xxh3::with_seed(hash::PART_SEED);
        h.update(self.small.get(..self.len).unwrap_or(&[]));
        h.update(x);
        self.big = Some(h);
    }
}

/// `GS part GS`: the head of a marker of a value without a `type`.
const PART_HEAD: &[u8; 6] = &[0x1D, b'p', b'a', b'r', b't', 0x1D];

/// If the value at `i` is at most 7 bytes long (found without checking
/// it): its bytes and length as a key, and its end.
fn short_value(b: &[u8], i: usize) -> Option<(u64, usize)> {
    let end = match b.get(i)? {
        b'-' | b'0'..=b'9' => skip_number_fast(b, i).ok()?,
        b'"' => {
            let (j, _) = scan_special(b, i + 1);
            (b.get(j) == Some(&b'"')).then_some(j + 1)?
        }
        b'{' | b'[' => {
            let j = ws(b, i + 1);
            matches!(b.get(j), Some(b'}' | b']')).then_some(j + 1)?
        }
        b't' | b'n' => i + 4,
        b'f' => i + 5,
        _ => return None,
    };
    let raw = b.get(i..end)?;
    if raw.len() > 7 {
        return None;
    }
    let key = raw
        .iter()
        .fold(raw.len() as u64, |k, &c| k << 8 | u64::from(c));
    Some((key, end))
}

/// Marker hashes of short values (in hex) by their bytes (direct-mapped,
/// 64 entries).
struct Memo {
    keys: [u64; 64],
    hex: [[u8; 16]; 64],
}

impl Memo {
    fn new() -> Self {
        // Key 0 is no value's key (it holds the length above the bytes).
        Memo {
            keys: [0; 64],
            hex: [[0; 16]; 64],
        }
    }
    fn slot(key: u64) -> usize {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize
    }
    /// The hex digits of the marker of the value whose key is `key`, in
    /// place (copied once, into the stream).
    #[inline]
    fn get(&self, key: u64) -> Option<&[u8; 16]> {
        let s = Self::slot(key);
        (self.keys.get(s) == Some(&key)).then(|| self.hex.get(s))?
    }
    fn put(&mut self, key: u64, hi: &[u8; 8], lo: &[u8; 8]) {
        let s = Self::slot(key);
        if let (Some(k), Some(h)) = (self.keys.get_mut(s), self.hex.get_mut(s)) {
            *k = key;
            let (a, b) = h.split_at_mut(8);
            a.copy_from_slice(hi);
            b.copy_from_slice(lo);
        }
    }
}

/// The second pass: writes the stream.
struct Em<'b, 's, S: PromptSink> {
    b: &'b [u8],
    out: Out<'s, S>,
    canon: Canon,
    part: PartHasher,
    memo: Memo,
    /// Number of records with content written.
    wrote: usize,
    anchored: bool,
    /// [`PromptSink::user_start`] was called.
    user_started: bool,
}

fn missing(what: &'static str) -> Fail {
    Fail { at: 0, what }
}

impl<S: PromptSink> Em<'_, '_, S> {
    fn run(&mut self, api: Api, t: &Top) -> Res<()> {
        match api {
            Api::ChatCompletions => {
                if let Some(x) = t.get(F_TOOLS).or(t.get(F_FUNCTIONS)) {
                    self.tools(x)?;
                }
                let m = t
                    .get(F_MESSAGES)
                    .ok_or(missing("missing field `messages`"))?;
                self.messages(m)?;
            }
            Api::Completions => {
                let p = t.get(F_PROMPT).ok_or(missing("missing field `prompt`"))?;
                self.prompt(p)?;
            }
            Api::Responses => {
                if let Some(x) = t.get(F_TOOLS) {
                    self.tools(x)?;
                }
                if let Some(q) = t.get(F_INSTRUCTIONS) {
                    self.out.put(RS);
                    self.out.put(b"system");
                    self.out.put(US);
                    decode_str(self.b, q + 1, true, &mut self.out)?;
                    self.wrote += 1;
                }
                if let Some(i) = t.get(F_INPUT) {
                    self.input(i)?;
                }
            }
            Api::Messages => {
                if let Some(s) = t.get(F_SYSTEM) {
                    self.out.put(RS);
                    self.out.put(b"system");
                    self.out.put(US);
                    self.content(s)?;
                    self.wrote += 1;
                }
                if let Some(x) = t.get(F_TOOLS) {
                    self.tools(x)?;
                }
                let m = t
                    .get(F_MESSAGES)
                    .ok_or(missing("missing field `messages`"))?;
                self.messages(m)?;
            }
        }
        Ok(())
    }

    /// The first user message begins (before its `RS`).
    fn user_start(&mut self) {
        if !self.user_started {
            self.user_started = true;
            self.out.flush();
            self.out.sink.user_start();
        }
    }

    fn mark_user(&mut self) {
        if !self.anchored {
            self.anchored = true;
            self.out.flush();
            self.out.sink.anchor();
        }
    }

    fn tools(&mut self, i: usize) -> Res<()> {
        self.out.put(RS);
        self.out.put(b"tools");
        self.out.put(US);
        self.canon.write(self.b, i, &mut self.out)?;
        Ok(())
    }

    fn messages(&mut self, i: usize) -> Res<()> {
        let b = self.b;
        if b.get(i) != Some(&b'[') {
            return fail(i, "invalid type: expected a sequence");
        }
        each(b, i, |j| self.message(j, false))?;
        Ok(())
    }

    /// Responses `input`.
    fn input(&mut self, i: usize) -> Res<()> {
        let b = self.b;
        match b.get(i) {
            Some(b'"') => {
                self.user_start();
                self.out.put(RS);
                self.out.put(b"user");
                self.out.put(US);
                decode_str(b, i + 1, true, &mut self.out)?;
                self.wrote += 1;
                self.mark_user();
            }
            Some(b'[') => {
                each(b, i, |j| {
                    if b.get(j) != Some(&b'{') {
                        return fail(j, "`input` items must be objects");
                    }
                    self.message(j, true)
                })?;
            }
            _ => return fail(i, "`input` must be a string or an array"),
        }
        Ok(())
    }

    /// A message at `i` (a struct); for Responses (`item`) an input item,
    /// written as a message or, if it is not one, as a marker.
    fn message(&mut self, i: usize, item: bool) -> Res<usize> {
        let b = self.b;
        self.canon.work.charge(cost::MESSAGE, i)?;
        match empty_object(b, i) {
            // No role, no content: as below, without the walk.
            Some(end) if !item => {
                self.out.put(RS);
                self.out.put(US);
                self.wrote += 1;
                return Ok(end);
            }
            _ => {}
        }
        let mut at: [Option<usize>; 6] = [None; 6];
        let mut seen = [false; 6];
        let mut streamed = false;
        // Whether the role is "user" (read once, when it is settled).
        let mut user = None;
        let mut m = Members::open(b, i, MESSAGE_FIELDS, true)?;
        if let Some(q) = role_head(b, i) {
            // As in the first pass.
            self.canon.work.charge(cost::MEMBER, q)?;
            let (e, r) = match key_word(b, q + 1, true) {
                Some((w, e)) => {
                    // The word read once answers whether it is `user` too.
                    user = Some(w == word_of(b"user"));
                    (e, Some(q))
                }
                None => opt_str(b, q, true)?,
            };
            (at[M_ROLE], seen[M_ROLE]) = (r, true);
            (m.i, m.first, m.seen) = (e, false, 1 << M_ROLE);
            if let Some(v) = content_head(b, e).filter(|_| !item) {
                // Its content next: written now, as below.
                let v = ws(b, v);
                self.canon.work.charge(cost::HEAD, v)?;
                m.seen |= 1 << M_CONTENT;
                m.i = if b.get(v) == Some(&b'n') {
                    skip_lit(b, v, b"null")?
                } else {
                    self.header(r, *user.get_or_insert_with(|| is_user(b, r)))?;
                    streamed = true;
                    self.content(v)?
                };
            }
        }
        while let Some((id, v)) = m.next(b)? {
            let v = ws(b, v);
            self.canon.work.charge(cost::MEMBER, v)?;
            m.i = match id {
                Some(M_CONTENT) if b.get(v) == Some(&b'n') => skip_lit(b, v, b"null")?,
                Some(M_CONTENT) => {
                    // Written now if its place is known: the role (and for
                    // an item, that it is a message) is settled.
                    let settled = seen[M_ROLE]
                        && (!item
                            || (seen[M_TYPE]
                                && at[M_ROLE].is_some()
                                && at[M_TYPE].is_none_or(|q| str_is(b, q, b"message"))));
                    if settled {
                        let u = *user.get_or_insert_with(|| is_user(b, at[M_ROLE]));
                        self.header(at[M_ROLE], u)?;
                        streamed = true;
                        self.content(v)?
                    } else {
                        at[M_CONTENT] = Some(v);
                        fast_skip(b, v)?
                    }
                }
                Some(M_TOOL_CALLS) if b.get(v) == Some(&b'n') => skip_lit(b, v, b"null")?,
                Some(M_TOOL_CALLS) => {
                    at[M_TOOL_CALLS] = Some(v);
                    fast_skip(b, v)?
                }
                Some(k) => {
                    let (e, q) = opt_str(b, v, true)?;
                    if let (Some(a), Some(s)) = (at.get_mut(k), seen.get_mut(k)) {
                        *a = q;
                        *s = true;
                    }
                    e
                }
                None => fast_skip(b, v)?,
            };
        }
        let end = m.i;
        if item {
            let is_msg =
                at[M_ROLE].is_some() && at[M_TYPE].is_none_or(|q| str_is(b, q, b"message"));
            if !is_msg {
                // function_call, function_call_output, reasoning...
                self.out.put(RS);
                self.marker(i)?;
                self.wrote += 1;
                return Ok(end);
            }
        }
        if !streamed {
            let u = *user.get_or_insert_with(|| is_user(b, at[M_ROLE]));
            self.header(at[M_ROLE], u)?;
            if let Some(c) = at[M_CONTENT] {
                self.content(c)?;
            }
        }
        if let Some(q) = at[M_NAME] {
            self.field(b"name", q)?;
        }
        if let Some(q) = at[M_TOOL_CALL_ID] {
            self.field(b"tool_call_id", q)?;
        }
        if let Some(v) = at[M_TOOL_CALLS] {
            self.out.put(US);
            self.out.put(b"tool_calls=");
            self.canon.write(b, v, &mut self.out)?;
        }
        self.wrote += 1;
        if user.unwrap_or_else(|| is_user(b, at[M_ROLE])) {
            self.mark_user();
        }
        Ok(end)
    }

    /// `RS role US` (`user`: the role is `user`).
    #[inline]
    fn header(&mut self, role: Option<usize>, user: bool) -> Res<()> {
        if !self.anchored && user {
            self.user_start();
        }
        self.out.put(RS);
        if let Some(q) = role {
            match key_word(self.b, q + 1, true) {
                // Short and plain: as written.
                Some((_, e)) => self.out.put(self.b.get(q + 1..e - 1).unwrap_or(&[])),
                None => _ = decode_str(self.b, q + 1, true, &mut self.out)?,
            }
        }
        self.out.put(US);
        Ok(())
    }

    /// `US name = value` for the string at `q`.
    fn field(&mut self, name: &[u8], q: usize) -> Res<()> {
        self.out.put(US);
        self.out.put(name);
        self.out.put(b"=");
        decode_str(self.b, q + 1, true, &mut self.out)?;
        Ok(())
    }

    /// A content value at `i`: string, array of parts, or null.
    fn content(&mut self, i: usize) -> Res<usize> {
        let b = self.b;
        match b.get(i) {
            Some(b'"') => decode_str(b, i + 1, true, &mut self.out),
            Some(b'[') => {
                let mut first = true;
                each(b, i, |j| {
                    if !first {
                        self.out.put(US);
                    }
                    first = false;
                    self.part(j)
                })
            }
            Some(b'n') => skip_lit(b, i, b"null"),
            _ => fail(i, "content must be a string, an array of parts or null"),
        }
    }

    /// A content part at `i`: its text, or a marker.
    fn part(&mut self, i: usize) -> Res<usize> {
        let b = self.b;
        if b.get(i) != Some(&b'{') || empty_object(b, i).is_some() {
            // Not an object, or one without a text: a marker.
            return self.marker(i);
        }
        self.canon.work.charge(cost::PART, i)?;
        // Whether the part's type (absent or null counts) is a text type.
        let (mut text_kind, mut kind_seen) = (true, false);
        let (mut text, mut streamed) = (None, false);
        let mut m = Members::open(b, i, PART_FIELDS, true)?;
        if let Some(at) = text_part_head(b, i) {
            // A text part as clients open it
            // ([`crate::json_stream::TEXT_PART_HEAD`]): its text straight
            // to the stream, then any further members as below.
            m.i = decode_str(b, at, true, &mut self.out)?;
            (m.first, m.seen, kind_seen, streamed) = (false, 0b11, true, true);
            text = Some(at - 1);
        }
        while let Some((id, v)) = m.next(b)? {
            let v = ws(b, v);
            self.canon.work.charge(cost::MEMBER, v)?;
            m.i = match id {
                Some(0) => {
                    kind_seen = true;
                    let (e, q) = opt_str(b, v, true)?;
                    text_kind = q.is_none_or(|q| {
                        str_is(b, q, b"text")
                            || str_is(b, q, b"input_text")
                            || str_is(b, q, b"output_text")
                    });
                    e
                }
                Some(_) if kind_seen && text_kind && b.get(v) == Some(&b'"') => {
                    text = Some(v);
                    streamed = true;
                    decode_str(b, v + 1, true, &mut self.out)?
                }
                Some(_) => {
                    let (e, q) = opt_str(b, v, true)?;
                    text = q;
                    e
                }
                None => fast_skip(b, v)?,
            };
        }
        match text {
            Some(q) if text_kind => {
                if !streamed {
                    decode_str(b, q + 1, true, &mut self.out)?;
                }
                Ok(m.i)
            }
            _ => self.marker(i),
        }
    }

    /// `GS type GS hex(xxh3(canonical json))` for the non-text value at `i`.
    fn marker(&mut self, i: usize) -> Res<usize> {
        let b = self.b;
        self.canon.work.charge(cost::MARKER, i)?;
        // A value of at most 7 bytes (a number, a short string, `{}`...) has
        // no `type` key, and the same bytes give the same marker: memoized,
        // so repeating one small part costs a lookup.
        let short = short_value(b, i);
        if let Some((key, end)) = short {
            if let Some(hex) = self.memo.get(key) {
                self.out.put(PART_HEAD);
                self.out.put(hex);
                return Ok(end);
            }
        }
        self.canon.work.charge(cost::HASH, i)?;
        // A number that prints as itself: its canonical JSON is its token.
        if let Some(b'-' | b'0'..=b'9') = b.get(i) {
            let end = match short {
                Some((_, e)) => e,
                None => skip_number(b, i)?,
            };
            let tok = b.get(i..end).unwrap_or(&[]);
            if number_is_plain(tok) {
                let h = hash::hash(tok, hash::PART_SEED);
                self.part_marker(h, short.filter(|s| s.1 == end).map(|s| s.0));
                return Ok(end);
            }
        }
        self.part.reset();
        let (end, ty) = self.canon.write(b, i, &mut self.part)?;
        let h = self.part.finish();
        match ty {
            Some(t) if b.get(t) == Some(&b'"') => {
                self.out.put(GS);
                decode_str(b, t + 1, true, &mut self.out)?;
                self.out.put(GS);
                self.out.put_hex(h);
            }
            _ => self.part_marker(h, short.filter(|s| s.1 == end).map(|s| s.0)),
        }
        Ok(end)
    }

    /// `GS part GS hex(h)`; memoized under `key` if given.
    fn part_marker(&mut self, h: u64, key: Option<u64>) {
        let (hi, lo) = (hex8((h >> 32) as u32), hex8(h as u32));
        self.out.put(PART_HEAD);
        self.out.put(&hi);
        self.out.put(&lo);
        if let Some(key) = key {
            self.memo.put(key, &hi, &lo);
        }
    }

    /// Completions `prompt`: string, array of strings, token ids, or arrays
    /// of token ids (anything else, even partly, is an error).
    fn prompt(&mut self, i: usize) -> Res<()> {
        let b = self.b;
        match b.get(i) {
            Some(b'"') => {
                let mut c = Counted(&mut self.out, 0);
                decode_str(b, i + 1, true, &mut c)?;
                self.wrote += usize::from(c.1 > 0);
            }
            Some(b'[') => match b.get(ws(b, i + 1)) {
                Some(b']') => {}
                Some(b'-' | b'0'..=b'9') => {
                    self.tokens(i)?;
                }
                Some(b'"' | b'[') => {
                    let mut first = true;
                    each(b, i, |j| {
                        if !first {
                            self.out.put(RS);
                        }
                        first = false;
                        match b.get(j) {
                            Some(b'"') => {
                                let mut c = Counted(&mut self.out, 0);
                                let e = decode_str(b, j + 1, true, &mut c)?;
                                self.wrote += usize::from(c.1 > 0);
                                Ok(e)
                            }
                            Some(b'[') => self.tokens(j),
                            _ => fail(
                                j,
                                "data did not match any variant of untagged enum PromptValue",
                            ),
                        }
                    })?;
                }
                _ => {
                    return fail(
                        i,
                        "data did not match any variant of untagged enum PromptValue",
                    )
                }
            },
            _ => {
                return fail(
                    i,
                    "data did not match any variant of untagged enum PromptValue",
                )
            }
        }
        Ok(())
    }

    /// An array of u32 token ids at `i`, as little-endian u32s.
    fn tokens(&mut self, i: usize) -> Res<usize> {
        let b = self.b;
        let mut n = 0usize;
        let end = each(b, i, |j| {
            let e = match b.get(j) {
                Some(b'0'..=b'9') => skip_number(b, j)?,
                _ => {
                    return fail(
                        j,
                        "data did not match any variant of untagged enum PromptValue",
                    )
                }
            };
            let mut v: u32 = 0;
            for &d in b.get(j..e).unwrap_or(&[]) {
                let digit = match d {
                    b'0'..=b'9' => u32::from(d - b'0'),
                    _ => {
                        return fail(
                            j,
                            "data did not match any variant of untagged enum PromptValue",
                        )
                    }
                };
                v = match v.checked_mul(10).and_then(|v| v.checked_add(digit)) {
                    Some(v) => v,
                    None => {
                        return fail(
                            j,
                            "data did not match any variant of untagged enum PromptValue",
                        )
                    }
                };
            }
            self.out.put(&v.to_le_bytes());
            n += 1;
            Ok(e)
        })?;
        self.wrote += usize::from(n > 0);
        Ok(end)
    }
}

/// `x` as 8 lowercase hex digits, most significant first.
#[inline]
fn hex8(x: u32) -> [u8; 8] {
    // Each nibble into its own byte (nibble k in byte k), then to ASCII:
    // '0' + n, plus 39 more for n >= 10 ('a' = '0' + 10 + 39).
    let mut v = u64::from(x);
    v = (v | v << 16) & 0x0000_FFFF_0000_FFFF;
    v = (v | v << 8) & 0x00FF_00FF_00FF_00FF;
    v = (v | v << 4) & 0x0F0F_0F0F_0F0F_0F0F;
    let ge10 = ((v + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
    (v + 0x3030_3030_3030_3030 + ge10 * 39).to_be_bytes()
}

/// `h` as 16 lowercase hex digits, most significant first.
#[cfg(test)]
fn hex16(h: u64) -> [u8; 16] {
    let (hi, lo) = (hex8((h >> 32) as u32), hex8(h as u32));
    let mut out = [0u8; 16];
    let (a, b) = out.split_at_mut(8);
    a.copy_from_slice(&hi);
    b.copy_from_slice(&lo);
    out
}

/// Canonical JSON of the JSON text `value` by the streaming writer, with the
/// errors of `serde_json::from_slice::<Value>`; for tests and tools.
pub fn canonical_json(value: &[u8]) -> Result<Vec<u8>, ExtractError> {
    let i = ws(value, 0);
    let e = skip_value(value, i, true, &mut Frames::default()).map_err(perr)?;
    end_of_body(value, e).map_err(perr)?;
    let mut out = Vec::new();
    let (end, _) = Canon::default().write(value, i, &mut out).map_err(perr)?;
    end_of_body(value, end).map_err(perr)?;
    Ok(out)
}
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::*;

    struct Rec {
        bytes: Vec<u8>,
        anchor: Option<usize>,
    }
    impl PromptSink for Rec {
        fn write(&mut self, b: &[u8]) {
            self.bytes.extend_from_slice(b);
        }
        fn anchor(&mut self) {
            assert!(self.anchor.is_none(), "anchor called twice");
            self.anchor = Some(self.bytes.len());
        }
    }
    fn run(api: Api, body: &str) -> (Vec<u8>, Option<usize>, String) {
        let mut r = Rec {
            bytes: vec![],
            anchor: None,
        };
        let m = extract(api, body.as_bytes(), &mut r).unwrap();
        (r.bytes, r.anchor, m.model.into_owned())
    }

    #[test]
    fn chat_whitespace_and_field_order_do_not_matter() {
        let a = r#"{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"b":1,"a":2}}}]}"#;
        let b = r#"{ "tools" : [ {"type":"function", "function":{"name":"f","parameters":{"b":1 ,"a":2}}} ],
                    "messages":[{"content":"S","role":"system"},{ "content":"hi","role":"user"}], "model":"m" }"#;
        assert_eq!(run(Api::ChatCompletions, a), run(Api::ChatCompletions, b));
        // Inside canonical JSON, members keep the order they are written in.
        let c = a.replace(r#"{"b":1,"a":2}"#, r#"{"a":2,"b":1}"#);
        assert_ne!(run(Api::ChatCompletions, a), run(Api::ChatCompletions, &c));
    }

    #[test]
    fn chat_turns_share_prefix_and_anchor() {
        let t1 = r#"{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"}]}"#;
        let t2 = r#"{"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}"#;
        let (b1, a1, _) = run(Api::ChatCompletions, t1);
        let (b2, a2, _) = run(Api::ChatCompletions, t2);
        assert!(b2.starts_with(&b1));
        assert!(b2.len() > b1.len());
        assert_eq!(a1, Some(b1.len()));
        assert_eq!(a1, a2);
    }

    #[test]
    fn string_and_text_parts_are_the_same_bytes() {
        let a = r#"{"messages":[{"role":"user","content":"hello"}]}"#;
        let b = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hello"}]}]}"#;
        assert_eq!(run(Api::ChatCompletions, a), run(Api::ChatCompletions, b));
    }

    #[test]
    fn non_text_parts_get_stable_markers() {
        let a = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"http://x/1.png","detail":"low"}}]}]}"#;
        let b = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"see"},{ "type":"image_url","image_url":{"url":"http://x/1.png", "detail":"low"},"cache_control":{"type":"ephemeral"}}]}]}"#;
        let c = r#"{"messages":[{"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"http://x/2.png"}}]}]}"#;
        let (ba, _, _) = run(Api::ChatCompletions, a);
        assert_eq!(ba, run(Api::ChatCompletions, b).0);
        assert_ne!(ba, run(Api::ChatCompletions, c).0);
        let s = String::from_utf8_lossy(&ba);
        assert!(s.contains("\u{1d}image_url\u{1d}"), "{s:?}");
    }

    #[test]
    fn escapes_are_decoded() {
        let a = r#"{"messages":[{"role":"user","content":"line1\nline2 \u00e9"}]}"#;
        let (b, _, _) = run(Api::ChatCompletions, a);
        assert!(String::from_utf8(b).unwrap().contains("line1\nline2 é"));
    }

    #[test]
    fn model_is_returned_not_streamed() {
        let (b, _, m) = run(
            Api::ChatCompletions,
            r#"{"model":"llama","messages":[{"role":"user","content":"x"}]}"#,
        );
        assert_eq!(m, "llama");
        assert!(!String::from_utf8_lossy(&b).contains("llama"));
    }

    #[test]
    fn tool_calls_and_names_are_included() {
        let a = r#"{"messages":[{"role":"user","content":"x"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"}]}"#;
        let (b, _, _) = run(Api::ChatCompletions, a);
        let s = String::from_utf8_lossy(&b);
        assert!(s.contains("tool_calls=[{\"id\":\"c1\",\"type\""));
        assert!(s.contains("tool_call_id=c1"));
    }

    #[test]
    fn completions_forms() {
        let (a, anchor, _) = run(Api::Completions, r#"{"model":"m","prompt":"abc"}"#);
        assert_eq!(a, b"abc");
        assert_eq!(anchor, None);
        let (b, _, _) = run(Api::Completions, r#"{"prompt":["abc","de"]}"#);
        assert_eq!(b, b"abc\x1ede");
        let (c, _, _) = run(Api::Completions, r#"{"prompt":[1,2]}"#);
        assert_eq!(c, [1, 0, 0, 0, 2, 0, 0, 0]);
        let (d, _, _) = run(Api::Completions, r#"{"prompt":[[1],[2]]}"#);
        assert_eq!(d, [1, 0, 0, 0, 0x1e, 2, 0, 0, 0]);
    }

    #[test]
    fn responses_forms() {
        let (a, an, _) = run(
            Api::Responses,
            r#"{"model":"m","instructions":"be brief","input":"hi"}"#,
        );
        assert_eq!(a, b"\x1esystem\x1fbe brief\x1euser\x1fhi");
        assert_eq!(an, Some(a.len()));
        let (b, _, _) = run(
            Api::Responses,
            r#"{"model":"m","instructions":"be brief","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]}"#,
        );
        assert_eq!(a, b);
        let (c, _, _) = run(
            Api::Responses,
            r#"{"input":[{"role":"user","content":"hi"},{"type":"function_call","call_id":"1","name":"f","arguments":"{}"}]}"#,
        );
        assert!(String::from_utf8_lossy(&c).contains("\u{1d}function_call\u{1d}"));
    }

    #[test]
    fn anthropic_forms() {
        let a = r#"{"model":"claude","system":"S","messages":[{"role":"user","content":"q"}]}"#;
        let b = r#"{"model":"claude","system":[{"type":"text","text":"S","cache_control":{"type":"ephemeral"}}],"messages":[{"role":"user","content":[{"type":"text","text":"q"}]}]}"#;
        let (ba, an, m) = run(Api::Messages, a);
        assert_eq!(m, "claude");
        assert_eq!(ba, run(Api::Messages, b).0);
        assert_eq!(an, Some(ba.len()));
    }

    #[test]
    fn bad_bodies() {
        let mut v = Vec::new();
        assert!(matches!(
            extract(Api::ChatCompletions, b"not json", &mut v),
            Err(ExtractError::Parse(_))
        ));
        assert!(matches!(
            extract(Api::ChatCompletions, br#"{"model":"m"}"#, &mut v),
            Err(ExtractError::Parse(_))
        ));
        assert!(matches!(
            extract(Api::ChatCompletions, br#"{"messages":[]}"#, &mut v),
            Err(ExtractError::EmptyPrompt)
        ));
        assert!(matches!(
            extract(Api::Completions, br#"{"prompt":""}"#, &mut v),
            Err(ExtractError::EmptyPrompt)
        ));
        assert!(matches!(
            extract(
                Api::ChatCompletions,
                br#"{"messages":[{"role":"user","content":5}]}"#,
                &mut v
            ),
            Err(ExtractError::Parse(_))
        ));
        assert!(matches!(
            extract(Api::ChatCompletions, br#"[1,2]"#, &mut v),
            Err(ExtractError::Parse(_))
        ));
    }

    #[test]
    fn hex16_is_lowercase_hex() {
        for h in [
            0u64,
            1,
            0xdead_beef,
            u64::MAX,
            0x0123_4567_89ab_cdef,
            0xa0a0_9f9f_0909_fafa,
        ] {
            assert_eq!(hex16(h), *format!("{h:016x}").as_bytes());
        }
        let mut x = 7u64;
        for _ in 0..10_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            assert_eq!(hex16(x), *format!("{x:016x}").as_bytes());
        }
    }

    #[test]
    fn api_from_path() {
        assert_eq!(
            Api::from_path("/v1/chat/completions"),
            Some(Api::ChatCompletions)
        );
        assert_eq!(
            Api::from_path("/openai/v1/chat/completions/"),
            Some(Api::ChatCompletions)
        );
        assert_eq!(Api::from_path("/v1/completions"), Some(Api::Completions));
        assert_eq!(Api::from_path("/v1/responses"), Some(Api::Responses));
        assert_eq!(Api::from_path("/v1/messages"), Some(Api::Messages));
        assert_eq!(Api::from_path("/v1/embeddings"), None);
    }

    proptest::proptest! {
        /// Arbitrary bytes never panic the extractor.
        #[test]
        fn never_panics(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
            for api in [Api::ChatCompletions, Api::Completions, Api::Responses, Api::Messages] {
                let mut v = Vec::new();
                let _ = extract(api, &data, &mut v);
            }
        }
    }
}
