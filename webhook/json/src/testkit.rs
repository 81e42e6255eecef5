//! Test inputs for every reader of JSON in Splice: real pods and reviews, and proptest strategies
//! that mutate them where readers most often go wrong. For tests and fuzz targets only (feature
//! `testkit`).

use proptest::prelude::*;

pub const SEEDS: [&str; 5] = [
    include_str!("../../testdata/pod-3k.json"),
    include_str!("../../testdata/pod-8k.json"),
    include_str!("../../testdata/pod-45k.json"),
    include_str!("../../testdata/pod-2000-env.json"),
    r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1",
    "kind":{"group":"","version":"v1","kind":"Pod"},"resource":{"group":"","version":"v1",
    "resource":"pods"},"operation":"CREATE","namespace":"a","userInfo":{"username":"x"},
    "object":{"kind":"Pod","metadata":{"name":"p","labels":{"app":"x"},"annotations":{"a":"b"}},
    "spec":{"containers":[{"name":"app","env":[{"name":"A","value":"1"}],
    "volumeMounts":[{"mountPath":"/x"}]}],"volumes":[{"name":"v"}]}},"dryRun":false}}"#,
];

/// Fragments that probe the grammar's edges where they are most often got wrong.
pub const FRAGMENTS: &[&str] = &[
    r#""\ud800""#,
    r#""\ud83d\ude00""#,
    r#""\udc00""#,
    r#""\ud800\u0041""#,
    r#""\ud800\n""#,
    r#""\ud800x""#,
    r#""\u00e9\u12""#,
    r#""\x""#,
    "\"a\u{1}b\"",
    "\"é\u{1F600}\"",
    "-0",
    "1e400",
    "01",
    "1.",
    "1.5e+3",
    "-",
    "2E-",
    "tru",
    "nul",
    "null",
    "[1,]",
    "{\"a\":1,}",
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
    r#""name":"x","#,
    r#""name":"dup","name":"last","#,
    r#""metadata":{"labels":{"a":"1","a":"2"}},"#,
    r#""kind":"Pod","#,
    r#""na\u006de":"esc","#,
    r#""containers":[{"name":"c\"q"}],"#,
    r#""annotations":{"x":[1,{"y":null}]},"#,
    ",",
    ":",
    " \t\r\n",
    "\u{0}",
];

/// A real document with one to three edits: a byte replaced, a fragment inserted (anywhere, or
/// just inside an object where the views read keys), the end cut off, or the whole nested.
pub fn mutated() -> impl Strategy<Value = String> {
    let edit = prop_oneof![
        (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Byte(i, b)),
        (any::<prop::sample::Index>(), 0..FRAGMENTS.len()).prop_map(|(i, f)| Edit::Insert(i, f)),
        (any::<prop::sample::Index>(), 0..FRAGMENTS.len()).prop_map(|(i, f)| Edit::InObject(i, f)),
        any::<prop::sample::Index>().prop_map(Edit::Cut),
        (0usize..300).prop_map(Edit::Nest),
    ];
    (0..SEEDS.len(), prop::collection::vec(edit, 1..4)).prop_map(|(seed, edits)| {
        let mut doc = SEEDS[seed].as_bytes().to_vec();
        for e in edits {
            e.apply(&mut doc);
        }
        // Edits work on bytes; keep the text whole (lossy replacement keeps the shape).
        String::from_utf8_lossy(&doc).into_owned()
    })
}

/// An AdmissionReview with one to three edits, mostly inside its objects.
pub fn mutated_review() -> impl Strategy<Value = String> {
    let edit = prop_oneof![
        1 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Byte(i, b)),
        1 => (any::<prop::sample::Index>(), 0..FRAGMENTS.len()).prop_map(|(i, f)| Edit::Insert(i, f)),
        3 => (any::<prop::sample::Index>(), 0..REVIEW_FRAGMENTS.len())
            .prop_map(|(i, f)| Edit::InObjectReview(i, f)),
        1 => any::<prop::sample::Index>().prop_map(Edit::Cut),
    ];
    prop::collection::vec(edit, 1..4).prop_map(|edits| {
        let mut doc = SEEDS[4].as_bytes().to_vec();
        for e in edits {
            e.apply(&mut doc);
        }
        String::from_utf8_lossy(&doc).into_owned()
    })
}

/// Members the envelope reader cares about: repeated, null, wrongly typed, escaped.
const REVIEW_FRAGMENTS: &[&str] = &[
    r#""uid":"dup","#,
    r#""uid":null,"#,
    r#""uid":7,"#,
    r#""u\u0069d":"esc","#,
    r#""kind":{"kind":"Deployment"},"#,
    r#""kind":null,"#,
    r#""apiVersion":"v1","#,
    r#""dryRun":"yes","#,
    r#""dryRun":null,"#,
    r#""object":null,"#,
    r#""object":[1,"#,
    r#""operation":"DELETE","#,
    r#""subResource":"status","#,
    r#""namespace":"","#,
    r#""request":{},"#,
    r#""resource":{"resource":"pods","group":"apps"},"#,
    r#""x":{"y":[true,false,null,-1.5e3]},"#,
];

#[derive(Clone, Debug)]
enum Edit {
    Byte(prop::sample::Index, u8),
    Insert(prop::sample::Index, usize),
    InObject(prop::sample::Index, usize),
    InObjectReview(prop::sample::Index, usize),
    Cut(prop::sample::Index),
    Nest(usize),
}

impl Edit {
    fn apply(self, doc: &mut Vec<u8>) {
        if doc.is_empty() {
            return;
        }
        match self {
            Edit::Byte(i, b) => {
                let i = i.index(doc.len());
                // Mostly structural bytes: random ones almost always just break the document.
                const PICK: &[u8] = b"\"\\{}[],:0-e \x01u9.n";
                doc[i] = if b < 200 {
                    PICK[usize::from(b) % PICK.len()]
                } else {
                    b
                };
            }
            Edit::Insert(i, f) => {
                let i = i.index(doc.len() + 1);
                doc.splice(i..i, FRAGMENTS[f].bytes());
            }
            Edit::InObject(i, f) => {
                let braces: Vec<usize> = (0..doc.len()).filter(|&k| doc[k] == b'{').collect();
                if let Some(&at) = braces.get(i.index(braces.len().max(1))) {
                    doc.splice(at + 1..at + 1, FRAGMENTS[f].bytes());
                }
            }
            Edit::InObjectReview(i, f) => {
                let braces: Vec<usize> = (0..doc.len()).filter(|&k| doc[k] == b'{').collect();
                if let Some(&at) = braces.get(i.index(braces.len().max(1))) {
                    doc.splice(at + 1..at + 1, REVIEW_FRAGMENTS[f].bytes());
                }
            }
            Edit::Cut(i) => doc.truncate(i.index(doc.len())),
            Edit::Nest(n) => {
                let mut out = vec![b'['; n];
                out.append(doc);
                out.extend(std::iter::repeat_n(b']', n));
                *doc = out;
            }
        }
    }
}
