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
    cases.extend(adversarial().into_iter().map(|(n, b)| (n.to_string(), b)));
    cases
}
