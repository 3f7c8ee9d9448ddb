//! [`Replica`]: the scheduler state machine of one model-server replica.
//!
//! ## Model
//!
//! * **Waiting queue** (FIFO): submitted requests wait here until they can
//!   be admitted. Admission is first-come-first-served with head-of-line
//!   blocking, like vLLM's FCFS scheduler: the head is admitted when the
//!   running batch has fewer than `max_running` requests **and** its KV fits
//!   (its blocks plus private tokens, after evicting unpinned cached
//!   blocks). A request larger than the whole cache is admitted anyway when
//!   nothing else is running (so it cannot deadlock).
//! * **Admission** does the prefix-cache lookup (counted in the
//!   `queries`/`hits` counters) and pins/inserts the request's full blocks;
//!   its private KV (trailing partial block + all `output_tokens`) is
//!   reserved up front (no preemption is modeled). Because lookup happens at
//!   admission, a queued request benefits from prefixes inserted while it
//!   waited. Blocks are unpinned at `Done`.
//! * **Prefill**: admitted requests go through a single FIFO prefill server
//!   (prefill is compute-bound, so prefills do not overlap). Duration:
//!   [`CostModel::prefill_time`] of the *uncached* tokens. The prefill
//!   produces the first token ([`Event::FirstToken`]).
//! * **Decode**: the remaining `output_tokens - 1` tokens are produced one
//!   per decode step; all decoding requests advance together, with step time
//!   [`CostModel::decode_step_time_ctx`] of the current decode batch: its
//!   size and its context tokens (each sequence counted at its prompt plus
//!   half its output). This is tracked exactly with a "virtual decode
//!   clock", so a batch-dependent step time is handled without simulating
//!   every step. Decode runs concurrently with prefill; a prefill takes
//!   [`CostModel::prefill_mix_time`] longer for the decoding context when it
//!   starts (0 unless `kv_read_s_per_token` is set).
//! * **Reported counts** mirror what vLLM v1 and SGLang export, not the
//!   admission state above: "waiting" ([`Replica::num_waiting`], vLLM's
//!   `num_requests_waiting`, SGLang's `num_queue_reqs`) is every request
//!   whose prefill has not started, in the admission queue or queued for
//!   the prefill server; "running" ([`Replica::num_running`]) is the one
//!   prefilling plus the decoding ones. In vLLM v1 a request stays in the
//!   scheduler's waiting queue until the token budget of a step reaches it,
//!   and a prefill in progress takes that budget, so requests queued behind
//!   a prefill are reported waiting; SGLang keeps a request in its waiting
//!   queue until a prefill batch takes it. (Before this model reported
//!   queued-for-prefill requests as running, so a router reading the
//!   waiting count saw no queue short of `max_running`.) Admission counts
//!   every admitted, unfinished request against `max_running`.
//!
//! ## Driving it
//!
//! Time is `f64` seconds ([`Time`]) on the caller's clock; it must not go
//! backwards (earlier times are clamped). A driver loop:
//!
//! ```text
//! loop {
//!     let t = min(next arrival, replica.next_event_time());
//!     for ev in replica.advance(t) { ... }          // FirstToken / Done
//!     if arrival at t { replica.submit(id, prompt, out, t)?; }
//! }
//! ```
//!
//! `submit` and `abort` first advance the replica to `now`; events that
//! became due are kept and returned by the next `advance`.
//!
//! Deterministic: the same calls with the same arguments produce the same
//! events at bit-identical times. Simultaneous events are processed in a
//! fixed order (decode completions before a prefill completion, decode
//! completions in admission order).

use std::collections::{BTreeMap, VecDeque};
use std::fmt;

use crate::cache::PrefixCache;
use crate::cost::CostModel;
use crate::prompt::Prompt;
use crate::Time;

/// Request identifier, chosen by the caller; unique among live requests.
pub type ReqId = u64;

/// Something that happened to a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Event {
    /// Prefill finished and the first output token is out.
    FirstToken {
        req_id: ReqId,
        t: Time,
        /// Prompt tokens served from the prefix cache (decided at admission).
        cached_tokens: u64,
    },
    /// Last output token is out; the request left the replica.
    Done { req_id: ReqId, t: Time },
}

impl Event {
    /// The request this event is about.
    pub fn req_id(&self) -> ReqId {
        match self {
            Event::FirstToken { req_id, .. } | Event::Done { req_id, .. } => *req_id,
        }
    }

    /// When it happened.
    pub fn time(&self) -> Time {
        match self {
            Event::FirstToken { t, .. } | Event::Done { t, .. } => *t,
        }
    }
}

/// What [`Replica::submit`] could say right away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubmitInfo {
    /// Prompt length in tokens.
    pub prompt_tokens: u64,
    /// `Some(tokens served from cache)` if admitted immediately; `None` if
    /// queued (then it is reported with [`Event::FirstToken`]).
    pub cached_tokens: Option<u64>,
    /// Requests ahead of it in the waiting queue (0 if admitted).
    pub waiting_ahead: usize,
}

/// Why [`Replica::submit`] refused a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmitError {
    /// A live request already has this id.
    DuplicateId(ReqId),
    /// The prompt's blocks were hashed for another block size.
    BlockSizeMismatch { prompt: u32, cache: u32 },
}

impl fmt::Display for SubmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SubmitError::DuplicateId(id) => write!(f, "request id {id} is already live"),
            SubmitError::BlockSizeMismatch { prompt, cache } => write!(
                f,
                "prompt hashed with {prompt}-token blocks, cache uses {cache}-token blocks"
            ),
        }
    }
}

impl std::error::Error for SubmitError {}

/// Decode-queue key: (virtual decode time of completion as f64 bits, seq).
/// Non-negative f64 bit patterns sort like the numbers.
type DecodeKey = (u64, u64);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    PrefillQueued,
    Prefilling,
    Decoding(DecodeKey),
}

#[derive(Debug, Clone)]
struct Req {
    prompt: Prompt,
    output_tokens: u64,
    private_tokens: u64,
    cached_tokens: u64,
    phase: Phase,
}

/// Live requests by id (ordered map: no hasher, deterministic).
type ReqMap = BTreeMap<ReqId, Req>;

/// One model-server replica. See the module docs.
#[derive(Debug, Clone)]
pub struct Replica {
    cost: CostModel,
    cache: PrefixCache,
    now: Time,
    reqs: ReqMap,
    waiting: VecDeque<ReqId>,
    prefill_queue: VecDeque<ReqId>,
    prefilling: Option<(ReqId, Time)>,
    decoding: BTreeMap<DecodeKey, ReqId>,
    /// Context tokens of the decoding requests ([`Replica::context_of`]).
    decoding_ctx: u64,
    /// Virtual decode clock: decode steps taken since start (fractional).
    vclock: f64,
    seq: u64,
    pending: Vec<Event>,
    completed: u64,
    prompt_tokens_total: u64,
    generation_tokens_total: u64,
}

impl Replica {
    /// Idle replica with an empty cache sized by `cost`.
    pub fn new(cost: CostModel) -> Self {
        let cache = PrefixCache::new(cost.cache_capacity_tokens, cost.block_tokens);
        Self {
            cost,
            cache,
            now: 0.0,
            reqs: ReqMap::default(),
            waiting: VecDeque::new(),
            prefill_queue: VecDeque::new(),
            prefilling: None,
            decoding: BTreeMap::new(),
            decoding_ctx: 0,
            vclock: 0.0,
            seq: 0,
            pending: Vec::new(),
            completed: 0,
            prompt_tokens_total: 0,
            generation_tokens_total: 0,
        }
    }

    /// The cost model.
    pub fn cost(&self) -> &CostModel {
        &self.cost
    }

    /// The prefix cache (counters, occupancy).
    pub fn cache(&self) -> &PrefixCache {
        &self.cache
    }

    /// Latest time the replica has been advanced to.
    pub fn now(&self) -> Time {
        self.now
    }

    /// Requests whose prefill has not started: not yet admitted, or
    /// admitted and queued for the prefill server (vLLM
    /// `num_requests_waiting`, SGLang `num_queue_reqs`; see the module doc).
    pub fn num_waiting(&self) -> usize {
        self.waiting.len() + self.prefill_queue.len()
    }

    /// Requests prefilling or decoding (vLLM `num_requests_running`).
    pub fn num_running(&self) -> usize {
        usize::from(self.prefilling.is_some()) + self.decoding.len()
    }

    /// Admitted, unfinished requests (what `max_running` bounds).
    fn admitted(&self) -> usize {
        self.prefill_queue.len() + usize::from(self.prefilling.is_some()) + self.decoding.len()
    }

    /// KV-cache usage in `0..=1` (vLLM `kv_cache_usage_perc`): memory held
    /// by running requests; evictable cached blocks count as free.
    pub fn kv_usage(&self) -> f64 {
        self.cache.usage()
    }

    /// Requests completed so far.
    pub fn completed(&self) -> u64 {
        self.completed
    }

    /// Prompt tokens of admitted requests so far.
    pub fn prompt_tokens_total(&self) -> u64 {
        self.prompt_tokens_total
    }

    /// Output tokens of completed requests so far.
    pub fn generation_tokens_total(&self) -> u64 {
        self.generation_tokens_total
    }

    /// Tokens of `prompt` the cache would serve right now. Pure: no
    /// counters, no LRU change.
    pub fn peek_cached_tokens(&self, prompt: &Prompt) -> u64 {
        if prompt.block_tokens() != self.cache.block_tokens() {
            return 0;
        }
        self.cache.cached_tokens(prompt.blocks(), prompt.tokens())
    }

    /// No request waiting or running?
    pub fn is_idle(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Keep the KV blocks of a finished request's prompt **and output** in the
    /// prefix cache, as vLLM does for the full blocks a request computed
    /// (generated tokens included): the next turn of a chat, whose prompt
    /// extends this one with the reply, then hits them too. `extended` is the
    /// prompt the server would build from prompt + output text. The blocks
    /// go in unpinned (evictable, most recently used); nothing is inserted if
    /// they do not fit next to what running requests pin. Returns whether
    /// they were inserted. Does not count as a cache query.
    pub fn remember(&mut self, extended: &Prompt) -> bool {
        let blocks = extended.blocks();
        if extended.block_tokens() != self.cache.block_tokens() {
            return false;
        }
        if self.cache.acquire(blocks, 0, false) {
            self.cache.release(blocks, 0);
            true
        } else {
            false
        }
    }

    /// Drop all unpinned cached blocks, keeping the cache counters (vLLM's
    /// `POST /reset_prefix_cache`: the counters keep counting).
    pub fn flush_cache(&mut self) {
        self.cache.clear();
    }

    /// Drop all unpinned cached blocks and zero the cache counters.
    pub fn reset_cache(&mut self) {
        self.cache.clear();
        self.cache.reset_counters();
    }

    /// Submit a request at time `now`: `prompt`, then `output_tokens` tokens
    /// of output (at least 1). The replica is first advanced to `now` (events
    /// that became due are returned by the next [`Self::advance`]).
    pub fn submit(
        &mut self,
        req_id: ReqId,
        prompt: Prompt,
        output_tokens: u64,
        now: Time,
    ) -> Result<SubmitInfo, SubmitError> {
        if self.reqs.contains_key(&req_id) {
            return Err(SubmitError::DuplicateId(req_id));
        }
        if prompt.block_tokens() != self.cache.block_tokens() {
            return Err(SubmitError::BlockSizeMismatch {
                prompt: prompt.block_tokens(),
                cache: self.cache.block_tokens(),
            });
        }
        self.catch_up(now);
        let output_tokens = output_tokens.max(1);
        let prompt_tokens = prompt.tokens();
        let private_tokens =
            prompt_tokens.saturating_sub(prompt.block_covered_tokens()) + output_tokens;
        self.reqs.insert(
            req_id,
            Req {
                prompt,
                output_tokens,
                private_tokens,
                cached_tokens: 0,
                phase: Phase::Waiting,
            },
        );
        self.waiting.push_back(req_id);
        self.try_admit();
        let req = self.reqs.get(&req_id);
        let admitted = req.is_some_and(|r| r.phase != Phase::Waiting);
        Ok(SubmitInfo {
            prompt_tokens,
            cached_tokens: if admitted {
                req.map(|r| r.cached_tokens)
            } else {
                None
            },
            waiting_ahead: if admitted {
                0
            } else {
                self.waiting.len().saturating_sub(1)
            },
        })
    }

    /// Abort a live request at time `now` (e.g. client went away): it leaves
    /// the replica without a `Done` event and its KV is released. Returns
    /// `false` if the id is not live.
    pub fn abort(&mut self, req_id: ReqId, now: Time) -> bool {
        self.catch_up(now);
        let Some(req) = self.reqs.remove(&req_id) else {
            return false;
        };
        match req.phase {
            Phase::Waiting => {
                self.waiting.retain(|id| *id != req_id);
                return true; // nothing held; admission order unchanged
            }
            Phase::PrefillQueued => self.prefill_queue.retain(|id| *id != req_id),
            Phase::Prefilling => {
                self.prefilling = None;
                self.start_next_prefill();
            }
            Phase::Decoding(key) => {
                self.decoding.remove(&key);
                self.decoding_ctx = self.decoding_ctx.saturating_sub(Self::context_of(&req));
            }
        }
        self.cache.release(req.prompt.blocks(), req.private_tokens);
        self.try_admit();
        true
    }

    /// Time of the next event, if any. If events are already due (buffered
    /// by `submit`/`abort`), this is [`Self::now`].
    pub fn next_event_time(&self) -> Option<Time> {
        if !self.pending.is_empty() {
            return Some(self.now);
        }
        let pre = self.prefilling.map(|(_, t)| t);
        let dec = self.next_decode_time();
        match (pre, dec) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Advance to `now`, returning every event with time `<= now` in
    /// chronological order.
    pub fn advance(&mut self, now: Time) -> Vec<Event> {
        self.catch_up(now);
        std::mem::take(&mut self.pending)
    }

    // ---- internals ----

    fn step_time(&self) -> f64 {
        self.cost
            .decode_step_time_ctx(self.decoding.len(), self.decoding_ctx)
    }

    /// A decoding request's KV context for the step cost: its prompt plus
    /// half its output (its mean over the decode).
    fn context_of(req: &Req) -> u64 {
        req.prompt.tokens().saturating_add(req.output_tokens / 2)
    }

    fn next_decode_time(&self) -> Option<Time> {
        let (&(bits, _), _) = self.decoding.first_key_value()?;
        let left = (f64::from_bits(bits) - self.vclock).max(0.0);
        Some(self.now + left * self.step_time())
    }

    /// Move the clock to `t` (no event in between), advancing the virtual
    /// decode clock.
    fn move_clock(&mut self, t: Time) {
        if t > self.now {
            let step = self.step_time();
            if !self.decoding.is_empty() && step > 0.0 {
                self.vclock += (t - self.now) / step;
            }
            self.now = t;
        }
    }

    /// Process every event up to `target` into `self.pending`.
    fn catch_up(&mut self, target: Time) {
        // NaN or earlier times clamp to now.
        let target = if target > self.now { target } else { self.now };
        loop {
            let pre = self.prefilling.map(|(_, t)| t).filter(|t| *t <= target);
            let dec = self.next_decode_time().filter(|t| *t <= target);
            match (pre, dec) {
                (_, Some(td)) if pre.is_none_or(|tp| td <= tp) => self.finish_decode(td),
                (Some(tp), _) => self.finish_prefill(tp),
                _ => break,
            }
        }
        self.move_clock(target);
    }

    fn finish_decode(&mut self, t: Time) {
        self.move_clock(t);
        let Some(((bits, _), req_id)) = self.decoding.pop_first() else {
            return;
        };
        // Snap the virtual clock to the completion point (float safety).
        self.vclock = self.vclock.max(f64::from_bits(bits));
        self.pending.push(Event::Done {
            req_id,
            t: self.now,
        });
        self.finish(req_id);
        self.try_admit();
    }

    fn finish_prefill(&mut self, t: Time) {
        self.move_clock(t);
        let Some((req_id, _)) = self.prefilling.take() else {
            return;
        };
        let now = self.now;
        let mut done = false;
        if let Some(req) = self.reqs.get_mut(&req_id) {
            self.pending.push(Event::FirstToken {
                req_id,
                t: now,
                cached_tokens: req.cached_tokens,
            });
            if req.output_tokens <= 1 {
                done = true;
            } else {
                let vdone = self.vclock + (req.output_tokens - 1) as f64;
                self.seq += 1;
                let key = (vdone.to_bits(), self.seq);
                req.phase = Phase::Decoding(key);
                self.decoding_ctx = self.decoding_ctx.saturating_add(Self::context_of(req));
                self.decoding.insert(key, req_id);
            }
        }
        if done {
            self.pending.push(Event::Done { req_id, t: now });
            self.finish(req_id);
            self.try_admit();
        }
        self.start_next_prefill();
    }

    fn finish(&mut self, req_id: ReqId) {
        if let Some(req) = self.reqs.remove(&req_id) {
            if matches!(req.phase, Phase::Decoding(_)) {
                self.decoding_ctx = self.decoding_ctx.saturating_sub(Self::context_of(&req));
            }
            self.cache.release(req.prompt.blocks(), req.private_tokens);
            self.completed += 1;
            self.generation_tokens_total += req.output_tokens;
        }
    }

    fn try_admit(&mut self) {
        let max_running = self.cost.max_running.max(1);
        while let Some(&req_id) = self.waiting.front() {
            let running = self.admitted();
            if running >= max_running {
                break;
            }
            let Some(req) = self.reqs.get_mut(&req_id) else {
                self.waiting.pop_front();
                continue;
            };
            let blocks = req.prompt.blocks();
            let fits = self.cache.fits(blocks, req.private_tokens);
            if !fits && running > 0 {
                break;
            }
            req.cached_tokens = self.cache.query(blocks, req.prompt.tokens());
            self.cache.acquire(blocks, req.private_tokens, !fits);
            req.phase = Phase::PrefillQueued;
            self.prompt_tokens_total += req.prompt.tokens();
            self.waiting.pop_front();
            self.prefill_queue.push_back(req_id);
            self.start_next_prefill();
        }
    }

    fn start_next_prefill(&mut self) {
        if self.prefilling.is_some() {
            return;
        }
        while let Some(req_id) = self.prefill_queue.pop_front() {
            if let Some(req) = self.reqs.get_mut(&req_id) {
                let uncached = req.prompt.tokens().saturating_sub(req.cached_tokens);
                let end = self.now
                    + self.cost.prefill_time(uncached, req.cached_tokens)
                    + self.cost.prefill_mix_time(uncached, self.decoding_ctx);
                req.phase = Phase::Prefilling;
                self.prefilling = Some((req_id, end));
                return;
            }
        }
    }
}

#[cfg(test)]
#[allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]
mod tests {
    use super::*;

    fn model() -> CostModel {
        CostModel {
            prefill_tokens_per_s: 1000.0,
            prefill_overhead_s: 0.0,
            attention_coeff: 0.0,
            decode_step_s: 0.01,
            decode_step_per_seq_s: 0.0,
            kv_read_s_per_token: 0.0,
            prefill_chunk_tokens: 8192,
            max_running: 4,
            block_tokens: 16,
            cache_capacity_tokens: 10_000,
        }
    }

    /// 320-token prompt (20 full blocks) identified by `id`.
    fn prompt(id: u64) -> Prompt {
        Prompt::from_block_ids(320, &[id], 512, 16)
    }

    fn run_all(r: &mut Replica) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(t) = r.next_event_time() {
            out.extend(r.advance(t));
        }
        out
    }

    /// The time of the first event matching `f`.
    fn time_of(ev: &[Event], f: impl Fn(&Event) -> bool) -> f64 {
        ev.iter().find(|e| f(e)).unwrap().time()
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn remembered_output_blocks_serve_the_next_turn() {
        let mut r = Replica::new(model());
        let turn1 =
            b"<|user|>\nhello there, how are you today my friend?\n<|assistant|>\n".repeat(8);
        let reply = b"fine thanks ".repeat(40);
        let p1 = Prompt::from_bytes(&turn1, 16);
        r.submit(1, p1, 4, 0.0).unwrap();
        let t = run_all(&mut r).last().unwrap().time();
        let mut ext = turn1.clone();
        ext.extend_from_slice(&reply);
        assert!(r.remember(&Prompt::from_bytes(&ext, 16)));
        let mut turn2 = ext.clone();
        turn2.extend_from_slice(b"\n<|user|>\nand then?\n<|assistant|>\n");
        let p2 = Prompt::from_bytes(&turn2, 16);
        let full_ext_blocks = (ext.len() / 64) as u64 * 16;
        let info = r.submit(2, p2, 4, t).unwrap();
        assert_eq!(info.cached_tokens, Some(full_ext_blocks));
        // Without remembering, only turn 1's prompt blocks would hit.
        assert!(full_ext_blocks > (turn1.len() / 64) as u64 * 16);
        // Wrong block size: refused.
        assert!(!r.remember(&Prompt::from_bytes(&ext, 32)));
    }

    #[test]
    fn prefill_charged_only_for_uncached_tokens() {
        let mut r = Replica::new(model());
        let info = r.submit(1, prompt(7), 5, 0.0).unwrap();
        assert_eq!(info.cached_tokens, Some(0));
        assert_eq!(info.prompt_tokens, 320);
        let ev = run_all(&mut r);
        assert_eq!(ev.len(), 2);
        // 320 tokens at 1000 tok/s, then 4 more tokens at 10 ms.
        assert!(
            matches!(ev[0], Event::FirstToken { req_id: 1, cached_tokens: 0, t } if close(t, 0.32))
        );
        assert!(matches!(ev[1], Event::Done { req_id: 1, t } if close(t, 0.36)));

        // Same prompt: 19 of 20 blocks hit (last token always recomputed).
        let info = r.submit(2, prompt(7), 5, 1.0).unwrap();
        assert_eq!(info.cached_tokens, Some(304));
        let ev = run_all(&mut r);
        assert!(
            matches!(ev[0], Event::FirstToken { req_id: 2, cached_tokens: 304, t } if close(t, 1.016))
        );
        assert!(matches!(ev[1], Event::Done { req_id: 2, t } if close(t, 1.056)));
        assert_eq!(r.cache().queries(), 640);
        assert_eq!(r.cache().hits(), 304);

        // Different prompt: no hit.
        let info = r.submit(3, prompt(8), 1, 2.0).unwrap();
        assert_eq!(info.cached_tokens, Some(0));
        let ev = run_all(&mut r);
        assert_eq!(ev.len(), 2);
        assert!(close(ev[0].time(), 2.32) && close(ev[1].time(), 2.32));
        assert_eq!(r.completed(), 3);
        assert!(r.is_idle());
    }

    #[test]
    fn prefills_are_serialized_fifo() {
        let mut r = Replica::new(model());
        r.submit(1, prompt(1), 2, 0.0).unwrap();
        r.submit(2, prompt(2), 2, 0.0).unwrap();
        // 1 prefilling (running), 2 queued behind it (waiting).
        assert_eq!((r.num_waiting(), r.num_running()), (1, 1));
        let ev = run_all(&mut r);
        let firsts: Vec<_> = ev
            .iter()
            .filter_map(|e| match e {
                Event::FirstToken { req_id, t, .. } => Some((*req_id, *t)),
                _ => None,
            })
            .collect();
        assert_eq!(firsts.len(), 2);
        assert_eq!(firsts[0].0, 1);
        assert!(close(firsts[0].1, 0.32));
        assert_eq!(firsts[1].0, 2);
        assert!(close(firsts[1].1, 0.64));
    }

    #[test]
    fn queueing_when_max_running_reached() {
        let mut r = Replica::new(CostModel {
            max_running: 2,
            ..model()
        });
        assert_eq!(r.submit(1, prompt(1), 10, 0.0).unwrap().waiting_ahead, 0);
        // Admitted right after 1: 1's blocks are already inserted.
        assert_eq!(
            r.submit(2, prompt(1), 10, 0.0).unwrap().cached_tokens,
            Some(304)
        );
        let info = r.submit(3, prompt(2), 10, 0.0).unwrap();
        assert_eq!(info.cached_tokens, None);
        assert_eq!(info.waiting_ahead, 0);
        let info = r.submit(4, prompt(1), 10, 0.0).unwrap();
        assert_eq!(info.waiting_ahead, 1);
        // 1 prefilling; 2 admitted, queued for prefill; 3 and 4 not admitted.
        assert_eq!((r.num_waiting(), r.num_running()), (3, 1));
        // 1: prefill 0.32, done 0.41; 2: prefill to 0.336, done 0.426.
        let ev = r.advance(0.41 + 1e-9);
        assert_eq!(ev.len(), 3);
        assert!(matches!(ev[2], Event::Done { req_id: 1, .. }));
        // 3 admitted at 0.41 and prefilling, 2 decoding; 4 still waiting.
        assert_eq!((r.num_waiting(), r.num_running()), (1, 2));
        let ev = run_all(&mut r);
        let first3 = ev
            .iter()
            .find(|e| matches!(e, Event::FirstToken { req_id: 3, .. }))
            .unwrap();
        assert!(close(first3.time(), 0.73));
        // 4 waited, then hit the prefix inserted by 1 while it waited.
        let first4 = ev
            .iter()
            .find(|e| matches!(e, Event::FirstToken { req_id: 4, .. }))
            .unwrap();
        assert!(matches!(
            first4,
            Event::FirstToken {
                cached_tokens: 304,
                ..
            }
        ));
        assert!(r.is_idle());
        assert_eq!(r.kv_usage(), 0.0);
    }

    #[test]
    fn queueing_when_kv_is_full_and_forced_admission() {
        // Room for 40 blocks of 16 = 640 tokens.
        let mut r = Replica::new(CostModel {
            cache_capacity_tokens: 640,
            ..model()
        });
        // 320 prompt + 10 output = 330 tokens each: only one fits at a time.
        r.submit(1, prompt(1), 10, 0.0).unwrap();
        let info = r.submit(2, prompt(2), 10, 0.0).unwrap();
        assert_eq!(info.cached_tokens, None);
        assert_eq!((r.num_waiting(), r.num_running()), (1, 1));
        assert!(r.kv_usage() > 0.5);
        let ev = run_all(&mut r);
        assert_eq!(ev.len(), 4);
        assert!(r.is_idle());
        // A request bigger than the whole cache still runs when alone.
        let big = Prompt::from_block_ids(2048, &[1, 2, 3, 4], 512, 16);
        let info = r.submit(3, big, 2, 10.0).unwrap();
        assert!(info.cached_tokens.is_some());
        assert_eq!(r.kv_usage(), 1.0);
        let ev = run_all(&mut r);
        assert_eq!(ev.len(), 2);
        assert!(r.cache().used_tokens() <= 640);
    }

    #[test]
    fn a_large_batch_context_slows_decode_and_the_next_prefill() {
        let m = CostModel {
            kv_read_s_per_token: 1e-5,
            prefill_chunk_tokens: 64,
            ..model()
        };
        // Alone: a 100-token prompt prefills in 0.1 s, then 10 steps of
        // 0.01 + 1e-5 x (100 + 11 / 2) tokens of context.
        let mut r = Replica::new(m.clone());
        r.submit(1, Prompt::uncacheable(100, 16), 11, 0.0).unwrap();
        let ev = run_all(&mut r);
        assert!(close(ev[0].time(), 0.1));
        assert!(close(ev[1].time(), 0.1 + 10.0 * (0.01 + 1e-5 * 105.0)));
        // A prefill starting while request 1 decodes pays 2 chunks of its
        // context: 0.1 + 2 x 1e-5 x 105.
        let mut r = Replica::new(m);
        r.submit(1, Prompt::uncacheable(100, 16), 11, 0.0).unwrap();
        r.submit(2, Prompt::uncacheable(100, 16), 11, 0.05).unwrap();
        let ev = run_all(&mut r);
        let first2 = time_of(&ev, |e| matches!(e, Event::FirstToken { req_id: 2, .. }));
        assert!(close(first2, 0.2 + 2.0 * 1e-5 * 105.0));
        // Nothing decodes at the end: the context sum went back to 0.
        assert_eq!(r.decoding_ctx, 0);
    }

    #[test]
    fn batch_dependent_decode_and_snapshots() {
        let m = CostModel {
            decode_step_per_seq_s: 0.01,
            ..model()
        };
        // Alone: step = 0.02 s.
        let mut r = Replica::new(m.clone());
        r.submit(1, Prompt::uncacheable(100, 16), 11, 0.0).unwrap();
        let ev = run_all(&mut r);
        assert!(close(ev[1].time(), 0.1 + 10.0 * 0.02));
        // Two decoding together are slower than alone.
        let mut r = Replica::new(m);
        r.submit(1, Prompt::uncacheable(100, 16), 11, 0.0).unwrap();
        r.submit(2, Prompt::uncacheable(100, 16), 11, 0.0).unwrap();
        let ev = run_all(&mut r);
        let done1 = time_of(&ev, |e| matches!(e, Event::Done { req_id: 1, .. }));
        assert!(done1 > 0.1 + 10.0 * 0.02 + 1e-6);
        // Events are in chronological order.
        assert!(ev.windows(2).all(|w| w[0].time() <= w[1].time()));
    }

    #[test]
    fn abort_releases_and_admits_next() {
        let mut r = Replica::new(CostModel {
            max_running: 1,
            ..model()
        });
        r.submit(1, prompt(1), 100, 0.0).unwrap();
        r.submit(2, prompt(2), 1, 0.0).unwrap();
        assert!(r.abort(1, 0.1));
        assert!(!r.abort(1, 0.1));
        assert_eq!((r.num_waiting(), r.num_running()), (0, 1));
        let ev = run_all(&mut r);
        assert_eq!(ev.len(), 2);
        assert!(ev.iter().all(|e| e.req_id() == 2));
        assert!(close(ev[0].time(), 0.42));
        // Aborted request's blocks were inserted and stay cached (unpinned).
        assert_eq!(r.peek_cached_tokens(&prompt(1)), 304);
        assert_eq!(r.cache().pinned_blocks(), 0);
    }

    #[test]
    fn submit_errors_and_buffered_events() {
        let mut r = Replica::new(model());
        r.submit(1, prompt(1), 1, 0.0).unwrap();
        assert_eq!(
            r.submit(1, prompt(1), 1, 0.0),
            Err(SubmitError::DuplicateId(1))
        );
        assert!(matches!(
            r.submit(2, Prompt::uncacheable(5, 512), 1, 0.0),
            Err(SubmitError::BlockSizeMismatch { .. })
        ));
        // Submitting late makes due events pending, returned by advance.
        r.submit(3, prompt(3), 1, 5.0).unwrap();
        assert_eq!(r.next_event_time(), Some(5.0));
        let ev = r.advance(5.0);
        assert_eq!(ev.len(), 2);
        assert!(close(ev[0].time(), 0.32));
        // Time going backwards is clamped.
        assert!(r.advance(1.0).is_empty());
        assert_eq!(r.now(), 5.0);
    }

    fn scripted_run() -> (Vec<Event>, u64, u64) {
        let mut r = Replica::new(CostModel {
            max_running: 3,
            cache_capacity_tokens: 2_000,
            decode_step_per_seq_s: 0.001,
            ..model()
        });
        let mut out = Vec::new();
        let mut t = 0.0;
        for i in 0..200u64 {
            t += 0.013 * ((i * 7919) % 11) as f64;
            out.extend(r.advance(t));
            let p = Prompt::from_block_ids(100 + (i * 37) % 400, &[i % 5, i % 3], 512, 16);
            r.submit(i, p, 1 + (i * 13) % 40, t).unwrap();
        }
        out.extend(run_all(&mut r));
        (out, r.cache().queries(), r.cache().hits())
    }

    #[test]
    fn deterministic() {
        let a = scripted_run();
        let b = scripted_run();
        assert_eq!(a.0.len(), 400);
        assert!(a.2 > 0);
        // Bit-identical times.
        assert!(a
            .0
            .iter()
            .zip(&b.0)
            .all(|(x, y)| x == y && x.time().to_bits() == y.time().to_bits()));
        assert_eq!((a.1, a.2), (b.1, b.2));
    }
}
