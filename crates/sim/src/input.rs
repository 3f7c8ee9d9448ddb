//! [`RouteInput`]: one request as every policy wants to see it, rendered
//! lazily (a policy that never asks for the JSON body does not pay for it).

use std::cell::OnceCell;
use std::ops::Range;

use prefix_router_core::extract::Api;
use prefix_router_replica::Prompt;

use crate::workload::{Request, Workload};

/// A request being routed.
pub struct RouteInput<'w> {
    pub wl: &'w Workload,
    pub req: &'w Request,
    /// Request id (index in the workload).
    pub id: u64,
    body: OnceCell<(Vec<u8>, Range<usize>)>,
    text: OnceCell<Vec<u8>>,
}

impl<'w> RouteInput<'w> {
    /// Wrap request `id` of `wl`.
    pub fn new(wl: &'w Workload, req: &'w Request, id: u64) -> Self {
        RouteInput {
            wl,
            req,
            id,
            body: OnceCell::new(),
            text: OnceCell::new(),
        }
    }

    /// The API (path) it is sent to.
    pub fn api(&self) -> Api {
        self.wl.api(self.req)
    }

    fn body_parts(&self) -> &(Vec<u8>, Range<usize>) {
        self.body.get_or_init(|| {
            let mut b = Vec::with_capacity(self.req.prompt.tokens() as usize * 4 + 256);
            let r = self.wl.write_body(self.req, &mut b);
            (b, r)
        })
    }

    /// The JSON request body.
    pub fn body(&self) -> &[u8] {
        &self.body_parts().0
    }

    /// What GIE's prefix plugin hashes: the completions prompt, or the chat
    /// `messages` array as JSON.
    pub fn gie_prompt(&self) -> &[u8] {
        let (b, r) = self.body_parts();
        b.get(r.clone()).unwrap_or(&[])
    }

    /// The text SGLang's router extracts for routing.
    pub fn routing_text(&self) -> &[u8] {
        if self.api() == Api::Completions {
            // The prompt string carries no escapes: the body span is the text.
            return self.gie_prompt();
        }
        self.text.get_or_init(|| {
            let mut t = Vec::new();
            self.wl.write_routing_text(self.req, &mut t);
            t
        })
    }

    /// First `n` characters of the first user message / the prompt.
    pub fn first_user(&self, n: usize) -> Vec<u8> {
        let mut v = Vec::new();
        self.wl.write_first_user(self.req, n, &mut v);
        v
    }

    /// The replica's view of the prompt.
    pub fn prompt(&self) -> &Prompt {
        &self.req.prompt
    }
}
