//! Where a refused key of a config file is, and where it belongs.
//!
//! A key unknown to its table is refused by serde (`deny_unknown_fields`), with toml's span of
//! the key: the message gains the table(s) the key belongs in ([`homes`]: `seq_len` under
//! `[dataset]` belongs in `[dataset.tokens]`). The `[dataset]` table is read in two steps (as
//! written, then checked by kind, [`crate::dataset`]), and an error of the second step would
//! point at the whole table: those errors carry the path of the key they concern ([`at`]), and
//! [`locate`] finds that key's line and column in the file, so the message points at it as toml
//! points at its own errors ([`render`]).

use std::ops::Range;

use crate::dataset::TABLES;

/// The keys of the top-level tables (`[ring]`, `[dataset]`, `[plan]`, `[daemon]`), as their
/// structs read them.
const TOP: &[(&str, &[&str])] = &[
    (
        "ring",
        &["name", "slots", "slot_bytes", "in_order", "mode", "group"],
    ),
    (
        "dataset",
        &[
            "kind",
            "samples",
            "sample_shape",
            "dtype",
            "seed",
            "classes",
            "fields",
            "on_bad_sample",
            "tokens",
            "npy",
            "webdataset",
            "imagefolder",
            "image",
        ],
    ),
    (
        "plan",
        &[
            "batch_size",
            "shuffle",
            "seed",
            "epochs",
            "start_epoch",
            "drop_last",
            "rank",
            "world_size",
        ],
    ),
    (
        "daemon",
        &[
            "lease_ms",
            "reap_interval_ms",
            "idle_warn_ms",
            "on_bad_batch",
            "prefetch",
            "copies",
            "device",
            "cpus",
            "loader_cpus",
        ],
    ),
];

/// The tables of `[dataset]` (`[dataset.tokens]`, ...).
const SUB_TABLES: &[&str] = &["tokens", "npy", "webdataset", "imagefolder", "image"];

/// Where a key named `key` belongs, as table names (`[plan]`, `[dataset.tokens]`; a table's own
/// name, `[dataset.tokens]` for `tokens`). Empty: no table has it.
pub(crate) fn homes(key: &str) -> Vec<String> {
    let mut out = Vec::new();
    if TOP.iter().any(|t| t.0 == key) {
        out.push(format!("the top level, as the table [{key}]"));
    }
    if SUB_TABLES.contains(&key) {
        out.push(format!("[dataset], as the table [dataset.{key}]"));
    }
    for (table, keys) in TOP {
        if keys.contains(&key) && !SUB_TABLES.contains(&key) {
            out.push(format!("[{table}]"));
        }
    }
    for (table, keys, _) in TABLES {
        if keys.contains(&key) {
            out.push(format!("[dataset.{table}]"));
        }
    }
    out
}

/// serde's message for a key unknown to its table (`unknown field `k`, expected one of ...`),
/// with where the key belongs when another table has it.
pub(crate) fn unknown_key_hint(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    let key = &rest[..rest.find('`')?];
    let homes = homes(key);
    if homes.is_empty() {
        return None;
    }
    Some(format!(
        "{key} belongs in {}: move it there ({message})",
        homes.join(" or ")
    ))
}

/// Marks an error of the `[dataset]` table's second step with the path of the key it concerns
/// (`dataset.tokens.images`, `dataset.seq_len`, or a table, `dataset.image`).
const MARK: char = '\u{1}';

/// `message` about the key at `path` (dotted, from the top level).
pub(crate) fn at(path: &str, message: impl std::fmt::Display) -> String {
    format!("{MARK}{path}{MARK}{message}")
}

/// The key path [`at`] put into `message` (anywhere in it: serde may prefix it), and the message
/// without it.
pub(crate) fn split(message: &str) -> (Option<String>, String) {
    let Some(start) = message.find(MARK) else {
        return (None, message.to_string());
    };
    let after = &message[start + MARK.len_utf8()..];
    let Some(end) = after.find(MARK) else {
        return (None, message.replace(MARK, ""));
    };
    let path = after[..end].to_string();
    let text = format!("{}{}", &message[..start], &after[end + MARK.len_utf8()..]);
    (Some(path), text)
}

/// The span of the key at the dotted `path` in the TOML `text` (the deepest part of the path
/// that is there: a key of a table that is there, else the table).
pub(crate) fn locate(text: &str, path: &str) -> Option<Range<usize>> {
    let doc = toml_edit::ImDocument::parse(text).ok()?;
    let mut table: &dyn toml_edit::TableLike = doc.as_table();
    let mut found = None;
    for part in path.split('.') {
        let Some((key, item)) = table.get_key_value(part) else {
            break;
        };
        found = key.span().or_else(|| item.span()).or(found);
        match item.as_table_like() {
            Some(t) => table = t,
            None => break,
        }
    }
    found
}

/// `message` at `span` of `text`, drawn as toml draws its own errors: the line and column, the
/// line itself, a caret under the span.
pub(crate) fn render(text: &str, span: Range<usize>, message: &str) -> String {
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_no = text[..line_start].matches('\n').count() + 1;
    let column = text[line_start..start].chars().count();
    let content = text[line_start..].split('\n').next().unwrap_or("");
    let width = text[start..span.end.min(text.len()).max(start)]
        .chars()
        .count()
        .clamp(1, content.chars().count().saturating_sub(column).max(1));
    let gutter = " ".repeat(line_no.to_string().len());
    format!(
        "TOML parse error at line {line_no}, column {}\n{gutter} |\n{line_no} | {content}\n\
         {gutter} | {}{}\n{message}",
        column + 1,
        " ".repeat(column),
        "^".repeat(width)
    )
}

/// Whether the TOML `text` sets nothing: no key anywhere, only comments, blank lines and empty
/// tables. `None`: it is not TOML.
pub(crate) fn sets_nothing(text: &str) -> Option<bool> {
    fn empty(t: &toml::Table) -> bool {
        t.values().all(|v| v.as_table().is_some_and(empty))
    }
    text.parse::<toml::Table>().ok().map(|t| empty(&t))
}
