//! The cursor against serde_json, the oracle: same acceptance for arbitrary text and for mutated
//! real documents, same decoded strings.

use proptest::prelude::*;
use serde::de::IgnoredAny;

use super::*;
use crate::testkit::*;

/// serde's acceptance of `text` as any value.
fn serde_accepts(text: &str) -> bool {
    serde_json::from_str::<IgnoredAny>(text).is_ok()
}

fn assert_same_acceptance(text: &str) {
    let ours = validate(text);
    let theirs = serde_json::from_str::<IgnoredAny>(text);
    assert_eq!(
        ours.is_ok(),
        theirs.is_ok(),
        "cursor {ours:?} vs serde {theirs:?} on {:?}",
        text.chars().take(300).collect::<String>()
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_text_is_accepted_exactly_when_serde_accepts_it(
        text in "[\\[\\]{}\",:\\\\ 0-9.eE+\\-truefalsn\u{1}\u{e9}]{0,40}"
    ) {
        assert_same_acceptance(&text);
    }

    #[test]
    fn arbitrary_bytes_are_accepted_exactly_when_serde_accepts_them(
        bytes in prop::collection::vec(any::<u8>(), 0..64)
    ) {
        let ours = utf8(&bytes).and_then(validate);
        // serde skips string bodies without checking UTF-8; the request path wants text, so the
        // cursor's byte entry point refuses what is not UTF-8 anywhere.
        let theirs = std::str::from_utf8(&bytes).is_ok()
            && serde_json::from_slice::<IgnoredAny>(&bytes).is_ok();
        prop_assert_eq!(ours.is_ok(), theirs, "{:?}", ours);
    }

    #[test]
    fn mutated_real_documents_are_accepted_exactly_when_serde_accepts_them(doc in mutated()) {
        assert_same_acceptance(&doc);
    }

    #[test]
    fn strings_decode_as_serde_decodes_them(
        body in prop::collection::vec(prop_oneof![
            "[a-zé\u{1F600} \"/]",
            Just("\\\\".to_owned()), Just("\\\"".to_owned()), Just("\\/".to_owned()),
            Just("\\b\\f\\n\\r\\t".to_owned()), Just("\\u00e9".to_owned()),
            Just("\\uD83D\\uDE00".to_owned()), Just("\\ud800".to_owned()),
            Just("\\udc00".to_owned()), Just("\\u0000".to_owned()), Just("\\q".to_owned()),
            Just("\u{1f}".to_owned()), Just("\\u12".to_owned()),
        ], 0..8)
    ) {
        let text = format!("\"{}\"", body.concat());
        let mut c = Cursor::new(&text);
        let ours = c.string().map(|s| s.into_owned()).and_then(|s| c.finish().map(|()| s));
        let theirs = serde_json::from_str::<String>(&text);
        match (&ours, &theirs) {
            (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
            (Err(_), Err(_)) => {}
            _ => prop_assert!(false, "cursor {:?} vs serde {:?} on {}", ours, theirs, text),
        }
    }
}

#[test]
fn grammar_edges_match_serde() {
    let cases = [
        "",
        " ",
        "null",
        "nul",
        "nulll",
        "true",
        "false",
        "-0",
        "-",
        "01",
        "0",
        "1.",
        "1.0",
        "1e400",
        "1E+2",
        "1e",
        "1e+",
        "-01",
        "[]",
        "[ ]",
        "[1,]",
        "[,1]",
        "[1 2]",
        "{}",
        "{\"a\":1,}",
        "{\"a\" 1}",
        "{1:2}",
        "{\"a\":}",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"\\ud800\\udc00\"",
        "\"\\u00\"",
        "\"\\u00zz\"",
        "\"a\u{1}\"",
        "\"\\/\"",
        "[1] x",
        "[1]  \n",
        "\u{feff}1",
        "[\"\\",
        "{\"a\"",
        "{\"a\":[",
        "[\"a\",",
        "1 2",
    ];
    for case in cases {
        assert_same_acceptance(case);
    }
}

#[test]
fn nesting_is_not_limited_when_skipping_as_in_serde() {
    for depth in [127, 128, 129, 10_000] {
        let text = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        assert_same_acceptance(&text);
        let text = format!("{}1{}", "{\"a\":[".repeat(depth), "]}".repeat(depth));
        assert_same_acceptance(&text);
        let unbalanced = format!("{}{}", "[".repeat(depth), "}".repeat(depth));
        assert_same_acceptance(&unbalanced);
    }
}

#[test]
fn the_string_scanner_stops_at_the_first_quote_backslash_or_control_byte() {
    // Past two 16-byte steps, so that a stop is found in each lane of a step and in the tail.
    for len in 0..56 {
        for stop in [b'"', b'\\', 0x00, 0x1f] {
            for at in 0..len {
                let mut bytes = vec![b'a'; len];
                // Bytes that look like stops under a careless mask: high-bit and near values.
                for (k, b) in bytes.iter_mut().enumerate() {
                    *b = [b'a', 0xe9, 0x21, 0x5d, 0x23, 0x80, 0x20][k % 7];
                }
                bytes[at] = stop;
                assert_eq!(string_stop(&bytes), Some(at), "{bytes:?}");
            }
        }
        let clean = vec![0xc3u8; len];
        assert_eq!(string_stop(&clean), None);
    }
}

#[test]
fn keys_and_strings_borrow_unless_escaped() {
    let mut c = Cursor::new(r#" {"a":"x","b\u0031":"y\n"} "#);
    let mut m = c.object().unwrap();
    let k = c.key(&mut m).unwrap().unwrap();
    assert!(matches!(k, Cow::Borrowed("a")));
    assert!(matches!(c.string().unwrap(), Cow::Borrowed("x")));
    let k = c.key(&mut m).unwrap().unwrap();
    assert!(matches!(&k, Cow::Owned(s) if s == "b1"));
    assert_eq!(c.string().unwrap(), "y\n");
    assert_eq!(c.key(&mut m).unwrap(), None);
    c.finish().unwrap();
}

#[test]
fn raw_values_are_the_verbatim_span() {
    let mut c = Cursor::new(r#"[ {"a": [1, "\u00e9"]} , null]"#);
    let mut items = c.array().unwrap();
    assert!(c.item(&mut items).unwrap());
    assert_eq!(c.raw_value().unwrap(), r#"{"a": [1, "\u00e9"]}"#);
    assert!(c.item(&mut items).unwrap());
    assert_eq!(c.raw_value().unwrap(), "null");
    assert!(!c.item(&mut items).unwrap());
}

#[test]
fn errors_name_the_offset_and_the_class_without_echoing_input() {
    let secret = "s3cr3t-token-value";
    let e = validate(&format!("{{\"k\":\"{secret}")).unwrap_err();
    assert!(e.is_eof(), "{e}");
    assert!(!e.to_string().contains(secret), "{e}");
    let e = validate(&format!("{{\"k\":{secret}}}")).unwrap_err();
    assert!(e.is_syntax());
    assert_eq!(e.offset(), 5);
    assert!(!e.to_string().contains(secret), "{e}");
    let e = Cursor::new("[1]").string().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Shape);
    let e = utf8(b"[\"\xff\"]").unwrap_err();
    assert_eq!((e.kind(), e.offset()), (ErrorKind::Syntax, 2));
    assert!(serde_accepts("[1]"));
}

/// Walks every value of a valid document. At each it compares reading the value (containers
/// opened with `object`/`array`, as the views do, and walked inside) with the checking skip from
/// the same place: both must end at the same byte. Some containers are read, the others skipped.
fn walk(c: &mut Cursor<'_>, text: &str) -> Result<(), String> {
    let at = {
        c.peek();
        c.pos
    };
    let mut checked = Cursor::new(text);
    checked.pos = at;
    checked
        .skip_value()
        .map_err(|e| format!("the checking skip failed at {at}: {e}"))?;
    let byte = c.peek();
    let read = at % 3 != 0;
    match byte {
        Some(b'{') if read => {
            let mut m = c.object().map_err(|e| e.to_string())?;
            while c.key(&mut m).map_err(|e| e.to_string())?.is_some() {
                walk(c, text)?;
            }
        }
        Some(b'[') if read => {
            let mut m = c.array().map_err(|e| e.to_string())?;
            while c.item(&mut m).map_err(|e| e.to_string())? {
                walk(c, text)?;
            }
        }
        _ => c.skip_value().map_err(|e| e.to_string())?,
    }
    if c.pos != checked.pos {
        return Err(format!(
            "at {at}: reading ends at {}, the checking skip at {}",
            c.pos, checked.pos
        ));
    }
    Ok(())
}

/// `None` when `text` is not JSON; else whether reading every value ends where skipping it does.
fn reads_and_skips_agree(text: &str) -> Option<Result<(), String>> {
    validate(text).ok()?;
    let mut c = Cursor::new(text);
    Some(walk(&mut c, text).and_then(|()| c.finish().map_err(|e| e.to_string())))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn reading_a_mutated_document_ends_where_skipping_it_ends(doc in mutated()) {
        if let Some(Err(e)) = reads_and_skips_agree(&doc) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn reading_arbitrary_json_ends_where_skipping_it_ends(
        text in "[\\[\\]{}\",:\\\\ 0-9.eE+\\-truefalsn\u{e9}]{0,40}"
    ) {
        if let Some(Err(e)) = reads_and_skips_agree(&text) {
            prop_assert!(false, "{} on {:?}", e, text);
        }
    }
}

#[test]
fn reading_the_fixtures_ends_where_skipping_them_ends() {
    for seed in SEEDS {
        reads_and_skips_agree(seed).unwrap().unwrap();
    }
    for text in [
        "[]",
        " { } ",
        r#"[[],{},[[{}]],{"a":[1,{"b":"}]"}]}]"#,
        &format!("{}{}", "[".repeat(300), "]".repeat(300)),
    ] {
        reads_and_skips_agree(text).unwrap().unwrap();
    }
}

/// The fast pass against the exact one on `text`: where the fast pass accepts, the exact pass
/// accepts too and ends at the same byte.
fn fast_pass_agrees(text: &str) -> Result<(), String> {
    let Some(end) = fast_skip(text.as_bytes(), 0) else {
        return Ok(());
    };
    let mut c = Cursor::new(text);
    match c.skip_exact() {
        Ok(()) if c.pos == end => Ok(()),
        Ok(()) => Err(format!(
            "the fast pass ends at {end}, the exact one at {}",
            c.pos
        )),
        Err(e) => Err(format!(
            "the fast pass accepted what the exact one refuses: {e}"
        )),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn the_fast_pass_accepts_only_what_the_exact_pass_accepts_on_mutated_documents(
        doc in mutated()
    ) {
        if let Err(e) = fast_pass_agrees(&doc) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn the_fast_pass_accepts_only_what_the_exact_pass_accepts_on_arbitrary_text(
        text in "[\\[\\]{}\",:\\\\ 0-9.eE+\\-truefalsnu\u{1}\u{e9}]{0,40}"
    ) {
        if let Err(e) = fast_pass_agrees(&text) {
            prop_assert!(false, "{} on {:?}", e, text);
        }
    }
}

#[test]
fn the_fast_pass_takes_the_common_road_and_leaves_the_rest() {
    for seed in SEEDS {
        assert!(fast_skip(seed.as_bytes(), 0).is_some());
        fast_pass_agrees(seed).unwrap();
    }
    for case in FRAGMENTS {
        fast_pass_agrees(case).unwrap();
    }
    // Past 64 levels the exact pass takes over, and accepts.
    let deep = format!("{}1{}", "[".repeat(65), "]".repeat(65));
    assert!(fast_skip(deep.as_bytes(), 0).is_none());
    assert!(validate(&deep).is_ok());
}
