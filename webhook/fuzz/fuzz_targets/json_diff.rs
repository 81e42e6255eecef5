//! The JSON cursor against serde_json on arbitrary bytes: it accepts exactly what serde accepts
//! (for bytes, serde's acceptance plus UTF-8, which the request path requires of the whole body),
//! decodes strings to the same text, and the engine's pod views read from it equal what the serde
//! readers they replaced produced.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde::de::IgnoredAny;
use splice_json as json;

fuzz_target!(|data: &[u8]| {
    let ours = json::utf8(data).and_then(json::validate);
    let theirs = std::str::from_utf8(data).is_ok()
        && serde_json::from_slice::<IgnoredAny>(data).is_ok();
    assert_eq!(ours.is_ok(), theirs, "acceptance differs: cursor {ours:?}");

    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut c = json::Cursor::new(text);
    let ours = c
        .string()
        .map(|s| s.into_owned())
        .and_then(|s| c.finish().map(|()| s));
    let theirs = serde_json::from_str::<String>(text);
    match (&ours, &theirs) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "decoded strings differ"),
        (Err(_), Err(_)) => {}
        _ => panic!("string acceptance differs: cursor {ours:?} vs serde {theirs:?}"),
    }

    if let Err(e) = splice_engine::oracle_check_views(text) {
        panic!("views differ: {e}");
    }
});
