//! Request bodies for throughput and memory measurements: plain chat bodies
//! of a given size, and the adversarial element-heavy bodies of issue 21.
#![allow(dead_code, clippy::all)]

/// Deterministic text of `n` bytes (splitmix64 stream over a fixed seed),
/// no characters that need escaping.
pub fn text(n: usize, seed: u64) -> String {
    let words = [
        "the", "cache", "prefix", "token", "replica", "model", "route", "load",
    ];
    let mut s = String::with_capacity(n + 8);
    let mut x = seed;
    while s.len() < n {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        s.push_str(words[(z % words.len() as u64) as usize]);
        s.push(' ');
    }
    s.truncate(n);
    s
}

/// A chat body of about `total` bytes whose messages are plain text, the
/// system prompt first, then alternating turns of up to 1000 bytes.
pub fn plain_chat(total: usize) -> Vec<u8> {
    let mut s = String::from(r#"{"model":"llama-3.1-8b","stream":true,"messages":["#);
    s.push_str(&format!(
        r#"{{"role":"system","content":"{}"}}"#,
        text(2000.min(total / 4), 1)
    ));
    s.push_str(&format!(
        r#",{{"role":"user","content":"{}"}}"#,
        text(200.min(total / 8), 2)
    ));
    let mut i = 3;
    while s.len() + 40 < total {
        let role = if i % 2 == 1 { "assistant" } else { "user" };
        let n = (total - s.len() - 40).min(1000);
        s.push_str(&format!(
            r#",{{"role":"{role}","content":"{}"}}"#,
            text(n, i)
        ));
        i += 1;
    }
    s.push_str("]}");
    s.into_bytes()
}

/// A chat of about `total` bytes made of short turns, as in real human
/// chats (the BYU Chit-Chat conversations of `/work/shared/traces`: median
/// message 61 bytes, mean 89): turns of 14-200 bytes, cycling.
pub fn short_turn_chat(total: usize) -> Vec<u8> {
    let mut s = String::from(r#"{"model":"llama-3.1-8b","stream":true,"messages":["#);
    s.push_str(r#"{"role":"system","content":"You are a friendly chat partner."}"#);
    let lens = [61, 14, 120, 33, 200, 89, 47, 150, 25, 75];
    let mut i = 0usize;
    while s.len() + 260 < total {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        let n = lens[i % lens.len()];
        s.push_str(&format!(
            r#",{{"role":"{role}","content":"{}"}}"#,
            text(n, i as u64 + 7)
        ));
        i += 1;
    }
    s.push_str("]}");
    s.into_bytes()
}

/// An agent's request of about `total` bytes as coding agents send them:
/// twelve tools with JSON-schema parameters (keys in the order clients
/// write them, so most objects are reordered by canonical JSON), a 2 KB
/// system prompt, then rounds of an assistant tool call and its result
/// (200-3000 bytes), the legitimate body richest in structure.
pub fn agent_chat(total: usize) -> Vec<u8> {
    agent_chat_with(total, 1)
}

/// [`agent_chat`] with its twelve tools `copies` times over (an agent with
/// many MCP servers: 120 tools are about 85 KB of schemas).
pub fn agent_chat_with(total: usize, copies: usize) -> Vec<u8> {
    let mut s = String::from(r#"{"model":"llama-3.1-8b","stream":true,"tools":["#);
    let names = [
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
        "grep",
        "glob",
        "bash",
        "web_fetch",
        "todo_write",
        "ask_user",
        "run_tests",
        "git_diff",
    ];
    for (k, name) in names.iter().cycle().take(names.len() * copies).enumerate() {
        if k > 0 {
            s.push(',');
        }
        s.push_str(&format!(
            r#"{{"type":"function","function":{{"name":"{name}","description":"{}","parameters":{{"type":"object","properties":{{"path":{{"type":"string","description":"{}"}},"limit":{{"type":"integer","description":"{}","minimum":1}},"mode":{{"type":"string","enum":["fast","full","lines"],"description":"{}"}}}},"required":["path"],"additionalProperties":false}}}}}}"#,
            text(300, k as u64),
            text(80, k as u64 + 100),
            text(60, k as u64 + 200),
            text(50, k as u64 + 300),
        ));
    }
    s.push_str(r#"],"messages":["#);
    s.push_str(&format!(
        r#"{{"role":"system","content":"{}"}},{{"role":"user","content":"{}"}}"#,
        text(2000, 1),
        text(150, 2)
    ));
    let lens = [200, 3000, 800, 1500, 400, 2500];
    let mut i = 0usize;
    while s.len() + 3400 < total {
        let name = names[i % names.len()];
        s.push_str(&format!(
            r#",{{"role":"assistant","content":null,"tool_calls":[{{"id":"call_{i}","type":"function","function":{{"name":"{name}","arguments":"{{\"path\":\"src/{i}.rs\",\"limit\":200}}"}}}}]}},{{"role":"tool","tool_call_id":"call_{i}","content":"{}"}}"#,
            text(lens[i % lens.len()], i as u64 + 9)
        ));
        i += 1;
    }
    s.push_str("]}");
    s.into_bytes()
}

/// About 1 MiB each (the nesting one: 50,000 deep): a plain prompt for
/// comparison, then the element-heavy bodies of issue 21 and the worst
/// cases of canonical JSON (objects whose keys must be reordered).
pub fn adversarial() -> Vec<(&'static str, Vec<u8>)> {
    let mib = 1usize << 20;
    let wrap = |inner: String| format!(r#"{{"model":"m","messages":[{inner}]}}"#).into_bytes();
    let user = |content: String| wrap(format!(r#"{{"role":"user","content":{content}}}"#));
    let list = |item: &str, n: usize| vec![item; n].join(",");
    let tool = |desc: &str| {
        format!(
            r#"{{"model":"m","tools":[{{"type":"function","function":{{"name":"f","description":"{desc}"}}}}],"messages":[{{"role":"user","content":"q"}}]}}"#
        )
        .into_bytes()
    };
    let d = 50_000;
    vec![
        (
            "plain_prompt_1MiB",
            user(format!("\"{}\"", text(mib - 60, 9))),
        ),
        ("empty_messages_349k", wrap(list("{}", mib / 3))),
        (
            "short_messages_38k",
            wrap(list(r#"{"role":"user","content":"a"}"#, mib / 30)),
        ),
        (
            "number_parts_524k",
            user(format!("[{}]", list("0", mib / 2))),
        ),
        (
            "distinct_number_parts_200k",
            user(format!(
                "[{}]",
                (100_000..300_000)
                    .map(|i| i.to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            )),
        ),
        (
            "empty_object_parts_349k",
            user(format!("[{}]", list("{}", mib / 3))),
        ),
        (
            "text_parts_38k",
            user(format!(
                "[{}]",
                list(r#"{"type":"text","text":"a"}"#, mib / 27)
            )),
        ),
        (
            "nesting_50k_deep",
            format!(
                r#"{{"model":"m","x":{}{},"messages":[{{"role":"user","content":"hi"}}]}}"#,
                "[".repeat(d),
                "]".repeat(d)
            )
            .into_bytes(),
        ),
        (
            "escapes_524k",
            user(format!("\"{}\"", "\\n".repeat(mib / 2 - 40))),
        ),
        (
            "unicode_escapes_175k",
            user(format!("\"{}\"", "\\u00e9".repeat(mib / 6 - 20))),
        ),
        (
            // Escapes in canonical JSON (a tool's description): kept as
            // written, one at a time (`\n` is written alike by serde).
            "tool_escapes_524k",
            tool(&"\\n".repeat(mib / 2 - 80)),
        ),
        (
            "tool_unicode_escapes_175k",
            tool(&"\\u00e9".repeat(mib / 6 - 30)),
        ),
        (
            "surrogate_pairs_87k",
            user(format!("\"{}\"", "\\ud83d\\ude00".repeat(mib / 12 - 10))),
        ),
        (
            // An escape every third byte: each one cuts the text.
            "gapped_escapes_349k",
            user(format!("\"{}\"", "a\\n".repeat(mib / 3 - 20))),
        ),
        (
            "unsorted_tool_objects_75k",
            format!(
                r#"{{"model":"m","tools":[{}],"messages":[{{"role":"user","content":"q"}}]}}"#,
                list(r#"{"b":0,"a":0}"#, mib / 14)
            )
            .into_bytes(),
        ),
        (
            // Whitespace between every token: canonical JSON's runs are
            // cut at each.
            "spaced_tool_objects_58k",
            format!(
                r#"{{"model":"m","tools":[{}],"messages":[{{"role":"user","content":"q"}}]}}"#,
                vec![r#"{ "b": 0, "a": [ 1 ] }"#; mib / 18].join(" , ")
            )
            .into_bytes(),
        ),
        (
            "whitespace_1MiB",
            format!(
                r#"{{"model":"m","tools":[{}0],"messages":[{{"role":"user","content":"q"}}]}}"#,
                " \n".repeat(mib / 2 - 40)
            )
            .into_bytes(),
        ),
        (
            "unsorted_part_objects_75k",
            user(format!("[[{}]]", list(r#"{"b":0,"a":0}"#, mib / 14))),
        ),
        (
            "one_part_87k_keys",
            user(format!(
                "[{{{}}}]",
                (0..mib / 12)
                    .rev()
                    .map(|i| format!("\"{i:06}\":0"))
                    .collect::<Vec<_>>()
                    .join(",")
            )),
        ),
    ]
}

/// splitmix64's step: the `k`th number of the stream seeded `seed`.
fn mix(seed: u64, k: u64) -> u64 {
    let mut z = seed.wrapping_add(k.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A chat body with one user message whose content is `content` (already
/// escaped as JSON).
fn user_body(content: &str) -> Vec<u8> {
    format!(
        r#"{{"model":"llama-3.1-8b","stream":true,"messages":[{{"role":"system","content":"You are a helpful assistant."}},{{"role":"user","content":"{content}"}}]}}"#
    )
    .into_bytes()
}

/// A user message of about `total` body bytes: `piece(k)` for k = 0, 1, ...
fn user_text(total: usize, piece: impl Fn(u64) -> String) -> Vec<u8> {
    let mut s = String::with_capacity(total);
    let mut k = 0;
    while s.len() + 200 < total {
        s.push_str(&piece(k));
        k += 1;
    }
    user_body(&s)
}

/// CJK text of about `total` body bytes as Python's `json.dumps` writes it
/// by default (`ensure_ascii`): every character a `\uXXXX` escape
/// (U+4E00..U+9FFF, lowercase hex), 6 bytes a character.
pub fn cjk_escaped(total: usize) -> Vec<u8> {
    user_text(total, |k| {
        format!("\\u{:04x}", 0x4e00 + mix(11, k) % (0x9fff - 0x4e00 + 1))
    })
}

/// German prose of about `total` body bytes as `json.dumps` writes it:
/// umlauts and ß as `\u00fc` etc., about one character in 15.
pub fn umlaut_text(total: usize) -> Vec<u8> {
    let words = [
        "die",
        "der",
        "und",
        "f\\u00fcr",
        "nicht",
        "mit",
        "Stra\\u00dfe",
        "auch",
        "sch\\u00f6n",
        "werden",
        "M\\u00fcnchen",
        "Zeit",
        "k\\u00f6nnen",
        "Haus",
        "gro\\u00df",
        "Arbeit",
        "\\u00fcber",
        "Beispiel",
        "Anfrage",
        "w\\u00e4hrend",
        "Antwort",
        "Modell",
    ];
    user_text(total, |k| {
        let w = words[(mix(12, k) % words.len() as u64) as usize];
        format!("{w}{}", if k % 12 == 11 { ". " } else { " " })
    })
}

/// Text of about `total` body bytes with Windows line ends: lines of
/// 40-80 bytes, each ending `\r\n` in the JSON.
pub fn crlf_text(total: usize) -> Vec<u8> {
    user_text(total, |k| {
        format!("{}\\r\\n", text(40 + (mix(13, k) % 41) as usize, k + 100))
    })
}

/// A pasted CSV of about `total` body bytes, every field quoted: a `\"`
/// every 4 bytes or so, a `\n` a row.
pub fn csv_text(total: usize) -> Vec<u8> {
    user_text(total, |k| {
        format!("\\\"{k}\\\",\\\"name {k}\\\",\\\"x\\\"\\n")
    })
}

/// An agent chat of about `total` bytes as Python clients write it: each
/// turn an assistant tool call whose arguments are `json.dumps` of an
/// object and a tool message whose content is `json.dumps` of ten rows,
/// so strings full of `\"` (one every 5-6 bytes).
pub fn agent_json_tools(total: usize) -> Vec<u8> {
    let mut s = format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":"{}"}},{{"role":"user","content":"Find me flights to Paris and compare prices."}}"#,
        "You are a helpful agent. ".repeat(80)
    );
    let mut t = 0;
    loop {
        let args = format!(
            r#"{{\"query\": \"flights paris {t}\", \"max_results\": 10, \"filters\": {{\"class\": \"economy\", \"stops\": 0}}}}"#
        );
        let rows = (0..10)
            .map(|i| {
                format!(
                    r#"{{\"airline\": \"AF\", \"flight\": \"AF{t}{i}\", \"price\": {}, \"depart\": \"2026-01-01T10:00\", \"arrive\": \"2026-01-01T12:00\", \"stops\": 0}}"#,
                    100 + i
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        let turn = format!(
            r#",{{"role":"assistant","content":null,"tool_calls":[{{"id":"call_{t}","type":"function","function":{{"name":"search","arguments":"{args}"}}}}]}},{{"role":"tool","tool_call_id":"call_{t}","content":"[{rows}]"}}"#
        );
        if s.len() + turn.len() + 2 > total {
            break;
        }
        s.push_str(&turn);
        t += 1;
    }
    s.push_str("]}");
    s.into_bytes()
}

/// Realistic escape-dense bodies (what clients send, not crafted): at
/// 64 KiB and 1 MiB each.
pub fn escape_dense() -> Vec<(String, Vec<u8>)> {
    let mut v = Vec::new();
    for (n, tag) in [(64usize << 10, "64KiB"), (1 << 20, "1MiB")] {
        v.push((format!("cjk_u_escapes_{tag}"), cjk_escaped(n)));
        v.push((format!("umlaut_text_{tag}"), umlaut_text(n)));
        v.push((format!("crlf_text_{tag}"), crlf_text(n)));
        v.push((format!("csv_quotes_{tag}"), csv_text(n)));
        v.push((format!("agent_json_tools_{tag}"), agent_json_tools(n)));
        v.push((format!("code_agent_{tag}"), code_agent(n)));
    }
    // At 64 KiB no tool result of it fits: only at 1 MiB.
    v.push(("code_tool_results_1MiB".into(), code_tool_results(1 << 20)));
    v
}

/// [`code_agent`]'s source files as Anthropic's and the Responses API's
/// agents send tool output: in a non-text part (`tool_result`), whose
/// canonical JSON is hashed into a marker.
pub fn code_tool_results(total: usize) -> Vec<u8> {
    code_agent_as(total, |t, src| {
        format!(
            r#",{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"call_{t}","content":{src}}}]}}"#
        )
    })
}

/// The measured cases, named: plain chats of 1, 8, 64 and 256 KiB, a
/// chat of short turns (256 KiB), then
/// [`adversarial`] (the throughput probe and the criterion bench share them).
pub fn cases() -> Vec<(String, Vec<u8>)> {
    let mut cases: Vec<(String, Vec<u8>)> = [1usize << 10, 8 << 10, 64 << 10, 256 << 10]
        .iter()
        .map(|&n| (format!("plain_chat_{}KiB", n >> 10), plain_chat(n)))
        .collect();
    cases.push(("short_turn_chat_256KiB".into(), short_turn_chat(256 << 10)));
    cases.push(("agent_chat_32KiB".into(), agent_chat(32 << 10)));
    cases.push(("agent_chat_256KiB".into(), agent_chat(256 << 10)));
    cases.push((
        "agent_120_tools_96KiB".into(),
        agent_chat_with(96 << 10, 10),
    ));
    cases.extend(escape_dense());
    cases.extend(adversarial().into_iter().map(|(n, b)| (n.to_string(), b)));
    cases
}

/// A coding agent's chat of about `total` bytes: each turn an assistant
/// `read_file` call and a tool message holding a real source file (this
/// crate's own, JSON-escaped as clients send it: a `\n` every 30-40
/// bytes, `\"` and `\\` in string literals).
pub fn code_agent(total: usize) -> Vec<u8> {
    code_agent_as(total, |t, src| {
        format!(r#",{{"role":"tool","tool_call_id":"call_{t}","content":{src}}}"#)
    })
}

/// [`code_agent`] with each tool result written by `result(turn, escaped source)`.
fn code_agent_as(total: usize, result: impl Fn(usize, &str) -> String) -> Vec<u8> {
    let files: [(&str, &str); 4] = [
        ("src/extract.rs", include_str!("../../src/extract.rs")),
        (
            "src/json_stream.rs",
            include_str!("../../src/json_stream.rs"),
        ),
        ("src/spill.rs", include_str!("../../src/spill.rs")),
        ("src/config.rs", include_str!("../../src/config.rs")),
    ];
    let esc = |s: &str| serde_json::to_string(s).unwrap_or_default();
    let mut s = format!(
        r#"{{"model":"m","messages":[{{"role":"system","content":{}}},{{"role":"user","content":"Why does the router fall back on this body?"}}"#,
        esc(&"You are a coding agent. Read files before editing them.\n".repeat(40))
    );
    for t in 0.. {
        let (path, src) = files[t % files.len()];
        let turn = format!(
            r#",{{"role":"assistant","content":null,"tool_calls":[{{"id":"call_{t}","type":"function","function":{{"name":"read_file","arguments":{}}}}}]}}{}"#,
            esc(&format!(r#"{{"path": "{path}"}}"#)),
            result(t, &esc(src))
        );
        if s.len() + turn.len() + 2 > total {
            // Fill with the head of the next file.
            let room = total.saturating_sub(s.len() + 200);
            let mut cut = room.min(src.len());
            while !src.is_char_boundary(cut) {
                cut -= 1;
            }
            s.push_str(&format!(
                r#",{{"role":"user","content":{}}}"#,
                esc(&src[..cut])
            ));
            break;
        }
        s.push_str(&turn);
    }
    s.push_str("]}");
    s.into_bytes()
}
