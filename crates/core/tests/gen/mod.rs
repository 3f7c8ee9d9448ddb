//! Random request bodies for the four APIs, written byte by byte so that
//! whitespace, key order, duplicate keys, escapes (surrogate pairs, lone
//! surrogates, invalid escapes), number spellings, nesting depth, wrong
//! types and invalid bytes all occur. Deterministic from a seed.
#![allow(dead_code, clippy::all)]

use prefix_router_core::extract::Api;

/// splitmix64.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// True with probability `pct` percent.
    pub fn pct(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

pub struct Gen {
    pub r: Rng,
    pub out: Vec<u8>,
    /// Percent chance of a deliberate mistake at each opportunity.
    pub noise: u64,
}

const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "1",
    "-1",
    "7",
    "42",
    "1.0",
    "1.5",
    "-2.25",
    "1e2",
    "1E+2",
    "1e-2",
    "0.1",
    "3.14159",
    "100",
    "1e21",
    "1e22",
    "123456789012345678",
    "1234567890123456789",
    "12345678901234567890",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775808",
    "-9223372036854775809",
    "-123456789012345678",
    "123456789012345678901234567890",
    "4294967295",
    "4294967296",
    "1e308",
    "1.7976931348623157e308",
    "1e309",
    "1e400",
    "-1e400",
    "1e-400",
    "0e99999999999",
    "5e-324",
    "2.2250738585072014e-308",
    "0.30000000000000004",
    "9007199254740993",
    "1.00000000000000011102230246251565404236316680908203125",
    "9e15",
    "-0.0",
    "0.000001",
    "1e-7",
    "123.456e-2",
];
const BAD_NUMBERS: &[&str] = &[
    "01", "1.", ".5", "-", "+1", "1e", "1e+", "--1", "0x10", "NaN", "1.2.3",
];

const WORDS: &[&str] = &[
    "hello", "the", "cache", "prefix", " ", "text", "image", "user", "é", "日本", "😀", "a", "b",
    "",
];
const ESCAPES: &[&str] = &[
    "\\n",
    "\\t",
    "\\r",
    "\\b",
    "\\f",
    "\\/",
    "\\\\",
    "\\\"",
    "\\u0000",
    "\\u001f",
    "\\u0041",
    "\\u00e9",
    "\\u00E9",
    "\\u20ac",
    "\\ud83d\\ude00",
    "\\uD83D\\uDE00",
    "\\u007f",
    "\\u0080",
    "\\uffff",
    "\\ufeff",
];
const BAD_ESCAPES: &[&str] = &[
    "\\ud800",
    "\\udc00",
    "\\ud800x",
    "\\ud800\\n",
    "\\ud800\\u0041",
    "\\ud800\\ud800",
    "\\ude00\\ud83d",
    "\\x",
    "\\u12",
    "\\u12g4",
    "\\U0041",
    "\\'",
    "\\a",
];
const RAW_BAD: &[&[u8]] = &[
    b"\x00",
    b"\x01",
    b"\x1f",
    b"\n",
    b"\t",
    b"\xff",
    b"\xc3",
    b"\xe2\x82",
    b"\xed\xa0\x80",
    b"\x7f",
];

pub const KEYS: &[&str] = &[
    "type",
    "text",
    "cache_control",
    "a",
    "b",
    "A",
    "Z",
    "aa",
    "ab",
    "é",
    "e",
    "name",
    "id",
    "",
    "image_url",
    "url",
    "detail",
    "function",
    "arguments",
    "parameters",
    "properties",
    "_",
];
/// Key spellings with escapes (decoded: "ab", "type", "text", "é", "cache_control").
const ESC_KEYS: &[&str] = &[
    "a\\u0062",
    "\\u0074ype",
    "te\\u0078t",
    "\\u00e9",
    "cache\\u005fcontrol",
    "\\u0000",
    "a\\/b",
];

impl Gen {
    pub fn new(seed: u64, noise: u64) -> Self {
        Gen {
            r: Rng(seed),
            out: Vec::new(),
            noise,
        }
    }
    pub fn s(&mut self, x: &str) {
        self.out.extend_from_slice(x.as_bytes());
    }
    fn oops(&mut self) -> bool {
        self.noise > 0 && self.r.pct(self.noise)
    }
    pub fn ws(&mut self) {
        if self.r.pct(15) {
            let w = *self.r.pick(&[" ", "\n", "\t", "\r", "  ", "\r\n "]);
            self.s(w);
        }
    }

    /// A JSON string with random content.
    pub fn string(&mut self) {
        self.out.push(b'"');
        let n = self.r.below(6);
        for _ in 0..n {
            match self.r.below(10) {
                0..=5 => {
                    let w = *self.r.pick(WORDS);
                    self.s(w);
                }
                6..=8 => {
                    let e = *self.r.pick(ESCAPES);
                    self.s(e);
                }
                _ => {
                    if self.oops() {
                        if self.r.pct(50) {
                            let e = *self.r.pick(BAD_ESCAPES);
                            self.s(e);
                        } else {
                            let raw = *self.r.pick(RAW_BAD);
                            self.out.extend_from_slice(raw);
                        }
                    } else {
                        self.s("word");
                    }
                }
            }
        }
        self.out.push(b'"');
    }

    pub fn string_of(&mut self, x: &str) {
        self.out.push(b'"');
        self.s(x);
        self.out.push(b'"');
    }

    pub fn number(&mut self) {
        if self.oops() {
            let n = *self.r.pick(BAD_NUMBERS);
            self.s(n);
        } else if self.r.pct(30) {
            let n = self.r.next() % 100_000;
            self.s(&n.to_string());
        } else {
            let n = *self.r.pick(NUMBERS);
            self.s(n);
        }
    }

    pub fn key(&mut self) {
        if self.r.pct(10) {
            self.out.push(b'"');
            let k = *self.r.pick(ESC_KEYS);
            self.s(k);
            self.out.push(b'"');
        } else if self.r.pct(10) {
            self.string();
        } else {
            let k = *self.r.pick(KEYS);
            self.string_of(k);
        }
    }

    /// Any JSON value, nested at most `depth` more levels.
    pub fn value(&mut self, depth: usize) {
        self.ws();
        let k = if depth == 0 {
            self.r.below(5)
        } else {
            self.r.below(8)
        };
        match k {
            0 => self.s("null"),
            1 => {
                let t = if self.r.pct(50) { "true" } else { "false" };
                self.s(t)
            }
            2 => self.number(),
            3 | 4 => self.string(),
            5 => {
                self.out.push(b'[');
                let n = self.r.below(4);
                for i in 0..n {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    self.value(depth - 1);
                }
                self.close(b']');
            }
            _ => self.object(depth - 1, &mut |g, d| {
                g.key();
                g.ws();
                g.out.push(b':');
                g.value(d);
            }),
        }
        self.ws();
    }

    /// `{ member, member ... }` with 0..4 members written by `member`.
    pub fn object(&mut self, depth: usize, member: &mut dyn FnMut(&mut Gen, usize)) {
        self.out.push(b'{');
        let n = self.r.below(5);
        for i in 0..n {
            if i > 0 {
                self.out.push(b',');
            }
            self.ws();
            member(self, depth);
            self.ws();
        }
        self.close(b'}');
    }

    /// Close a container, sometimes badly.
    pub fn close(&mut self, c: u8) {
        if self.oops() {
            match self.r.below(4) {
                0 => self.out.push(b','),
                1 => {}
                2 => self.out.push(if c == b']' { b'}' } else { b']' }),
                _ => self.s(",,"),
            }
        }
        self.out.push(c);
    }

    pub fn field(&mut self, name: &str, val: &mut dyn FnMut(&mut Gen)) {
        self.ws();
        if self.r.pct(3) {
            // Same field, escaped spelling (serde decodes keys).
            self.out.push(b'"');
            let mut first = true;
            for ch in name.chars() {
                if first {
                    self.s(&format!("\\u{:04x}", ch as u32));
                    first = false;
                } else {
                    self.out.push(ch as u8);
                }
            }
            self.out.push(b'"');
        } else {
            self.string_of(name);
        }
        self.ws();
        self.out.push(b':');
        self.ws();
        val(self);
        self.ws();
    }

    /// Members in random order, some repeated, some unknown.
    pub fn members(
        &mut self,
        fields: &mut [(&str, &mut dyn FnMut(&mut Gen))],
        open: u8,
        close: u8,
    ) {
        self.out.push(open);
        let mut order: Vec<usize> = (0..fields.len()).filter(|_| self.r.pct(70)).collect();
        for i in (1..order.len()).rev() {
            let j = self.r.below(i + 1);
            order.swap(i, j);
        }
        if self.r.pct(4) && !fields.is_empty() {
            let d = self.r.below(fields.len());
            order.push(d);
        }
        let mut first = true;
        for idx in order {
            if !first {
                self.out.push(b',');
            }
            first = false;
            if self.r.pct(10) {
                self.ws();
                self.key();
                self.out.push(b':');
                self.value(2);
                self.out.push(b',');
            }
            let (name, f) = &mut fields[idx];
            let name = *name;
            self.field(name, *f);
        }
        self.close(close);
    }

    /// A nullable string field value.
    pub fn opt_string(&mut self) {
        match self.r.below(10) {
            0 => self.s("null"),
            1 if self.oops() => self.value(1),
            _ => self.string(),
        }
    }

    pub fn role(&mut self) {
        match self.r.below(10) {
            0 => self.s("null"),
            1 if self.oops() => self.number(),
            2..=5 => self.string_of("user"),
            6 => self.string_of("assistant"),
            7 => self.string_of("system"),
            8 => self.string_of("us\\u0065r"),
            _ => self.string(),
        }
    }

    pub fn kind(&mut self) {
        let k = *self.r.pick(&[
            "text",
            "input_text",
            "output_text",
            "image_url",
            "image",
            "message",
            "function_call",
            "te\\u0078t",
            "",
            "Text",
        ]);
        if self.r.pct(10) {
            self.s("null");
        } else if self.oops() {
            self.value(1);
        } else {
            self.string_of(k);
        }
    }

    pub fn part(&mut self) {
        match self.r.below(10) {
            0 => self.value(3),
            1 => {
                let n = 126 + self.r.below(4);
                self.deep(n)
            }
            _ => {
                let mut kind = |g: &mut Gen| g.kind();
                let mut text = |g: &mut Gen| g.opt_string();
                let mut cc = |g: &mut Gen| g.s("{\"type\":\"ephemeral\"}");
                let mut img = |g: &mut Gen| g.value(3);
                let mut fields: [(&str, &mut dyn FnMut(&mut Gen)); 4] = [
                    ("type", &mut kind),
                    ("text", &mut text),
                    ("cache_control", &mut cc),
                    ("image_url", &mut img),
                ];
                self.members(&mut fields, b'{', b'}');
            }
        }
    }

    /// `[[[...0...]]]` nested `n` deep.
    pub fn deep(&mut self, n: usize) {
        for _ in 0..n {
            self.out.push(if self.r.pct(80) { b'[' } else { b'[' });
        }
        self.s("0");
        for _ in 0..n {
            self.out.push(b']');
        }
    }

    pub fn content(&mut self) {
        match self.r.below(10) {
            0 => self.s("null"),
            1 if self.oops() => self.value(2),
            2..=5 => self.string(),
            _ => {
                self.out.push(b'[');
                let n = self.r.below(4);
                for i in 0..n {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    self.ws();
                    self.part();
                }
                self.close(b']');
            }
        }
    }

    pub fn tool_calls(&mut self) {
        if self.r.pct(20) {
            self.s("null");
        } else {
            self.out.push(b'[');
            let n = self.r.below(3);
            for i in 0..n {
                if i > 0 {
                    self.out.push(b',');
                }
                self.value(4);
            }
            self.close(b']');
        }
    }

    pub fn message(&mut self) {
        if self.r.pct(3) {
            // serde also reads a struct from an array, by position.
            self.out.push(b'[');
            self.kind();
            self.out.push(b',');
            self.role();
            if self.r.pct(70) {
                self.out.push(b',');
                self.content();
            }
            self.close(b']');
            return;
        }
        if self.r.pct(3) {
            self.s("{}");
            return;
        }
        let mut kind = |g: &mut Gen| g.kind();
        let mut role = |g: &mut Gen| g.role();
        let mut content = |g: &mut Gen| g.content();
        let mut name = |g: &mut Gen| g.opt_string();
        let mut tc = |g: &mut Gen| g.tool_calls();
        let mut tcid = |g: &mut Gen| g.opt_string();
        let mut fields: [(&str, &mut dyn FnMut(&mut Gen)); 6] = [
            ("role", &mut role),
            ("content", &mut content),
            ("type", &mut kind),
            ("name", &mut name),
            ("tool_calls", &mut tc),
            ("tool_call_id", &mut tcid),
        ];
        self.members(&mut fields, b'{', b'}');
    }

    pub fn messages(&mut self) {
        if self.r.pct(5) {
            self.s("null");
            return;
        }
        if self.oops() {
            self.value(2);
            return;
        }
        self.out.push(b'[');
        let n = self.r.below(5);
        for i in 0..n {
            if i > 0 {
                self.out.push(b',');
            }
            self.ws();
            self.message();
        }
        self.close(b']');
    }

    pub fn tools(&mut self) {
        match self.r.below(10) {
            0 => self.s("null"),
            1 => {
                let n = 125 + self.r.below(5);
                self.deep(n)
            }
            _ => {
                self.out.push(b'[');
                let n = self.r.below(3);
                for i in 0..n {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    self.value(5);
                }
                self.close(b']');
            }
        }
    }

    pub fn prompt(&mut self) {
        match self.r.below(12) {
            0 => self.s("null"),
            1 => self.value(2),
            2..=4 => self.string(),
            5 => self.s("[]"),
            6 | 7 => {
                self.out.push(b'[');
                let n = self.r.below(4);
                for i in 0..n {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    self.token();
                }
                self.close(b']');
            }
            _ => {
                self.out.push(b'[');
                let n = self.r.below(4);
                for i in 0..n {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    self.ws();
                    if self.r.pct(50) {
                        self.string();
                    } else {
                        self.out.push(b'[');
                        let m = self.r.below(3);
                        for j in 0..m {
                            if j > 0 {
                                self.out.push(b',');
                            }
                            self.token();
                        }
                        self.close(b']');
                    }
                }
                self.close(b']');
            }
        }
    }

    fn token(&mut self) {
        self.ws();
        if self.r.pct(15) {
            self.number();
        } else if self.r.pct(3) {
            self.string();
        } else {
            let n = self.r.next() % 70_000;
            self.s(&n.to_string());
        }
        self.ws();
    }

    pub fn input(&mut self) {
        match self.r.below(10) {
            0 => self.s("null"),
            1 => self.value(2),
            2..=4 => self.string(),
            _ => {
                self.out.push(b'[');
                let n = self.r.below(4);
                for i in 0..n {
                    if i > 0 {
                        self.out.push(b',');
                    }
                    self.ws();
                    if self.r.pct(70) {
                        self.message();
                    } else {
                        let mut kind = |g: &mut Gen| g.kind();
                        let mut cid = |g: &mut Gen| g.opt_string();
                        let mut args = |g: &mut Gen| g.value(3);
                        let mut role = |g: &mut Gen| g.role();
                        let mut fields: [(&str, &mut dyn FnMut(&mut Gen)); 4] = [
                            ("type", &mut kind),
                            ("call_id", &mut cid),
                            ("arguments", &mut args),
                            ("role", &mut role),
                        ];
                        self.members(&mut fields, b'{', b'}');
                    }
                }
                self.close(b']');
            }
        }
    }

    pub fn metadata(&mut self) {
        match self.r.below(6) {
            0 => self.s("null"),
            1 => {
                self.s("[");
                self.opt_string();
                self.s("]");
            }
            2 if self.oops() => self.value(2),
            _ => {
                let mut uid = |g: &mut Gen| g.opt_string();
                let mut other = |g: &mut Gen| g.value(2);
                let mut fields: [(&str, &mut dyn FnMut(&mut Gen)); 2] =
                    [("user_id", &mut uid), ("other", &mut other)];
                self.members(&mut fields, b'{', b'}');
            }
        }
    }

    /// A request body, mostly shaped for `api`.
    pub fn body(&mut self, api: Api) {
        self.ws();
        if self.r.pct(2) {
            self.value(3);
            return;
        }
        let seq = self.r.pct(2);
        let mut model = |g: &mut Gen| g.opt_string();
        let mut messages = |g: &mut Gen| g.messages();
        let mut tools = |g: &mut Gen| g.tools();
        let mut functions = |g: &mut Gen| g.tools();
        let mut prompt = |g: &mut Gen| g.prompt();
        let mut instructions = |g: &mut Gen| g.opt_string();
        let mut input = |g: &mut Gen| g.input();
        let mut system = |g: &mut Gen| g.content();
        let mut metadata = |g: &mut Gen| g.metadata();
        let mut user = |g: &mut Gen| g.opt_string();
        let mut salt = |g: &mut Gen| g.opt_string();
        let mut stream = |g: &mut Gen| g.value(3);
        let mut deep = |g: &mut Gen| {
            let n = 100 + g.r.below(2000);
            g.deep(n)
        };
        let p_main = 90;
        let want = |a: Api, f: &str| -> u64 {
            match (a, f) {
                (Api::ChatCompletions, "messages") => p_main,
                (Api::Messages, "messages") => p_main,
                (Api::Completions, "prompt") => p_main,
                (Api::Responses, "input") => p_main,
                _ => 40,
            }
        };
        let names = [
            "model",
            "messages",
            "tools",
            "functions",
            "prompt",
            "instructions",
            "input",
            "system",
            "metadata",
            "user",
            "cache_salt",
            "stream",
            "deep",
        ];
        let mut fields: [(&str, &mut dyn FnMut(&mut Gen)); 13] = [
            ("model", &mut model),
            ("messages", &mut messages),
            ("tools", &mut tools),
            ("functions", &mut functions),
            ("prompt", &mut prompt),
            ("instructions", &mut instructions),
            ("input", &mut input),
            ("system", &mut system),
            ("metadata", &mut metadata),
            ("user", &mut user),
            ("cache_salt", &mut salt),
            ("stream", &mut stream),
            ("deep", &mut deep),
        ];
        if seq {
            // Positional form (serde reads the request struct from an array).
            self.out.push(b'[');
            let n = self.r.below(12);
            for i in 0..n {
                if i > 0 {
                    self.out.push(b',');
                }
                let (_, f) = &mut fields[i.min(10)];
                f(self);
            }
            self.close(b']');
            return;
        }
        // Keep each field with its API-dependent probability, then shuffle.
        let mut order: Vec<usize> = (0..names.len())
            .filter(|&i| {
                let p = want(api, names[i]);
                self.r.pct(p)
            })
            .collect();
        for i in (1..order.len()).rev() {
            let j = self.r.below(i + 1);
            order.swap(i, j);
        }
        if self.r.pct(3) && !order.is_empty() {
            let d = order[self.r.below(order.len())];
            order.push(d);
        }
        self.out.push(b'{');
        for (n, idx) in order.into_iter().enumerate() {
            if n > 0 {
                self.out.push(b',');
            }
            let (name, f) = &mut fields[idx];
            let name = *name;
            self.field(name, *f);
        }
        self.close(b'}');
        self.ws();
        if self.oops() {
            let t = *self.r.pick(&["x", "{}", " ,", "\u{0}"]);
            self.s(t);
        }
    }
}

/// A random edit of `body`: delete, insert or replace a byte, or truncate.
pub fn mutate(r: &mut Rng, body: &mut Vec<u8>) {
    const INTERESTING: &[u8] = b"{}[]\",:\\ 0-1eEnul\x00\x1f\xff\xc3tu";
    if body.is_empty() {
        body.push(*r.pick(INTERESTING));
        return;
    }
    let at = r.below(body.len());
    match r.below(4) {
        0 => {
            body.remove(at);
        }
        1 => body.insert(at, *r.pick(INTERESTING)),
        2 => body[at] = *r.pick(INTERESTING),
        _ => body.truncate(at),
    }
}
