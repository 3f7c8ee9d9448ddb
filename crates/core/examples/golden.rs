//! Prints the golden vectors pinned in `hash.rs` tests.
use prefix_router_core::hash::*;
fn main() {
    println!("model_seed(\"\") = {:#018x}", model_seed(b"", None));
    println!("model = {:#018x}", model_seed(b"llama-3.1-8b", None));
    println!(
        "salted = {:#018x}",
        model_seed(b"llama-3.1-8b", Some(b"tenant-a"))
    );
    let seed = model_seed(b"llama-3.1-8b", None);
    let text: Vec<u8> = (0..200u32).map(|i| (i % 251) as u8).collect();
    println!("chain = {:#018x?}", chain_hashes(seed, 64, &text));
    let mut c = ChunkChain::new(seed, 64);
    c.write(&text);
    println!("prefix = {:#018x}", c.prefix_hash());
    println!("ring0 = {:#018x}", ring_point(b"127.0.0.1:18001", 0));
    println!("ring7 = {:#018x}", ring_point(b"127.0.0.1:18001", 7));
    println!(
        "session = {:#018x}",
        session_key(model_seed(b"m", None), b"sess-42")
    );
}
