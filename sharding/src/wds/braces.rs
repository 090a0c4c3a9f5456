//! Shard-list expansion as WebDataset does it (`shardlists.py:expand_urls`): a spec is split on
//! `::`, `${NAME}` is replaced by the environment variable `WDS_NAME`, and each part is brace-expanded
//! with the rules of the `braceexpand` package (0.1.7), quirks included:
//!
//! - `{a,b,c}` lists (an empty item is allowed: `x{,.bak}`), nested to any depth;
//! - integer ranges `{1..10}`, `{10..1}`, `{-2..2}`, with a step `{0..10..2}`; a bound written with a
//!   leading zero (`{000..999}`) pads every number to the width of the longer bound;
//! - letter ranges `{a..e}`, `{A..z..2}` over `A-Za-z`;
//! - a brace group that is neither a range nor a list stays literal (`{x}` gives `{x}`);
//! - `\` escapes the next character (removed from the output);
//! - unbalanced braces are an error.

use crate::error::{FormatError, Result};

/// The most URLs one spec may expand to; a typo such as `{0..999999999}` fails instead of
/// allocating gigabytes.
pub const MAX_EXPANDED_URLS: u64 = 10_000_000;

/// Expands a WebDataset shard spec (`data-{000000..000099}.tar::other-{0..3}.tar`) into URLs, in
/// order, reading `${NAME}` from the environment variable `WDS_NAME`.
pub fn expand_urls(spec: &str) -> Result<Vec<String>> {
    expand_urls_with(spec, |name| std::env::var(format!("WDS_{name}")).ok())
}

/// [`expand_urls`] with a caller-supplied lookup for `${NAME}` (given `NAME`, without the `WDS_`
/// prefix). A missing variable is an error, as in WebDataset.
pub fn expand_urls_with(
    spec: &str,
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for part in spec.split("::") {
        // WebDataset substitutes up to ten times so that a variable may name another one.
        let mut url = part.to_string();
        for _ in 0..10 {
            let next = envsubst(&url, &lookup)?;
            if next == url {
                break;
            }
            url = next;
        }
        let expanded = braceexpand(&url)?;
        if (out.len() + expanded.len()) as u64 > MAX_EXPANDED_URLS {
            return Err(too_many(spec));
        }
        out.extend(expanded);
    }
    Ok(out)
}

fn too_many(spec: &str) -> FormatError {
    FormatError::InvalidArgument(format!(
        "shard spec {spec:?} expands to more than {MAX_EXPANDED_URLS} URLs"
    ))
}

/// Replaces `${NAME}` (NAME = `\w+`) by `lookup(NAME)`.
fn envsubst(s: &str, lookup: &impl Fn(&str) -> Option<String>) -> Result<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(pos) = rest.find("${") {
        let after = &rest[pos + 2..];
        let name_len = after
            .char_indices()
            .find(|&(_, c)| !(c.is_alphanumeric() || c == '_'))
            .map_or(after.len(), |(i, _)| i);
        if name_len > 0 && after[name_len..].starts_with('}') {
            let name = &after[..name_len];
            let value = lookup(name).ok_or_else(|| {
                FormatError::InvalidArgument(format!(
                    "shard spec {s:?} uses ${{{name}}} but the environment variable WDS_{name} is not set"
                ))
            })?;
            out.push_str(&rest[..pos]);
            out.push_str(&value);
            rest = &after[name_len + 1..];
        } else {
            out.push_str(&rest[..pos + 2]);
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// One factor of a product: each alternative contributes its strings in order.
#[derive(Debug)]
enum Part {
    Literal(String),
    Range(Vec<String>),
    /// Alternatives, each a product of parts (a `{a,b}` list, or one nested pattern).
    Choice(Vec<Vec<Part>>),
}

fn count(parts: &[Part]) -> u64 {
    parts.iter().fold(1u64, |acc, p| {
        let n = match p {
            Part::Literal(_) => 1,
            Part::Range(v) => v.len() as u64,
            Part::Choice(alts) => alts
                .iter()
                .fold(0u64, |a, alt| a.saturating_add(count(alt))),
        };
        acc.saturating_mul(n)
    })
}

fn expand(parts: &[Part]) -> Vec<String> {
    let mut acc = vec![String::new()];
    for part in parts {
        let options: Vec<String> = match part {
            Part::Literal(s) => vec![s.clone()],
            Part::Range(v) => v.clone(),
            Part::Choice(alts) => alts.iter().flat_map(|alt| expand(alt)).collect(),
        };
        acc = acc
            .iter()
            .flat_map(|prefix| options.iter().map(move |o| format!("{prefix}{o}")))
            .collect();
    }
    acc
}

/// Brace-expands one pattern exactly like `braceexpand.braceexpand(pattern)` (escapes on).
pub fn braceexpand(pattern: &str) -> Result<Vec<String>> {
    let parts = parse_pattern(pattern)?;
    if count(&parts) > MAX_EXPANDED_URLS {
        return Err(too_many(pattern));
    }
    Ok(expand(&parts).into_iter().map(|s| unescape(&s)).collect())
}

/// `escape_re.sub(r'\1', s)` with `\\(.)`: drops a backslash before any character but a newline.
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(&next) = chars.peek() {
                if next != '\n' {
                    out.push(next);
                    chars.next();
                    continue;
                }
            }
        }
        out.push(c);
    }
    out
}

// The parser walks bytes: every byte it acts on (`{`, `}`, `,`, `\`) is ASCII, so every slice
// boundary it takes is a char boundary, as in the Python, which walks code points.
fn parse_pattern(pattern: &str) -> Result<Vec<Part>> {
    let b = pattern.as_bytes();
    let (mut start, mut pos, mut depth) = (0usize, 0usize, 0i64);
    let mut items = Vec::new();
    while pos < b.len() {
        match b[pos] {
            b'\\' => {
                pos += 2;
                continue;
            }
            b'{' => {
                if depth == 0 && pos > start {
                    items.push(Part::Literal(pattern[start..pos].to_string()));
                    start = pos;
                }
                depth += 1;
            }
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    let expr = &pattern[start + 1..pos];
                    match parse_expression(expr)? {
                        Some(part) => items.push(part),
                        None => {
                            items.push(Part::Literal("{".into()));
                            items.push(Part::Choice(vec![parse_pattern(expr)?]));
                            items.push(Part::Literal("}".into()));
                        }
                    }
                    start = pos + 1;
                }
            }
            _ => {}
        }
        pos += 1;
    }
    if depth != 0 {
        return Err(FormatError::InvalidArgument(format!(
            "unbalanced braces in shard spec {pattern:?}"
        )));
    }
    // `pos` may have stepped past the end over a trailing backslash.
    if start < b.len() {
        items.push(Part::Literal(pattern[start..].to_string()));
    }
    Ok(items)
}

fn parse_expression(expr: &str) -> Result<Option<Part>> {
    if let Some(range) = int_range(expr)? {
        return Ok(Some(Part::Range(range)));
    }
    if let Some(range) = char_range(expr) {
        return Ok(Some(Part::Range(range)));
    }
    parse_sequence(expr)
}

fn parse_sequence(seq: &str) -> Result<Option<Part>> {
    let b = seq.as_bytes();
    let (mut start, mut pos, mut depth) = (0usize, 0usize, 0i64);
    let mut alts = Vec::new();
    while pos < b.len() {
        match b[pos] {
            b'\\' => {
                pos += 2;
                continue;
            }
            b'{' => depth += 1,
            b'}' => depth -= 1,
            b',' if depth == 0 => {
                alts.push(seq[start..pos].to_string());
                start = pos + 1;
            }
            _ => {}
        }
        pos += 1;
    }
    if depth != 0 || alts.is_empty() {
        return Ok(None);
    }
    alts.push(seq[start.min(seq.len())..].to_string());
    let parsed = alts
        .iter()
        .map(|a| parse_pattern(a))
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(Part::Choice(parsed)))
}

/// Splits `A..B` or `A..B..S` into its pieces; `None` when the text has another shape.
fn split_range(expr: &str) -> Option<(&str, &str, Option<&str>)> {
    let mut pieces = expr.splitn(3, "..");
    let a = pieces.next()?;
    let b = pieces.next()?;
    let step = pieces.next();
    Some((a, b, step))
}

fn is_int(s: &str) -> bool {
    let digits = s.strip_prefix('-').unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit())
}

/// The step group of the range regexes: `-?(\d+)`, sign ignored.
fn parse_step(step: Option<&str>) -> Option<Option<&str>> {
    match step {
        None => Some(None),
        Some(s) => {
            let digits = s.strip_prefix('-').unwrap_or(s);
            (!digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit()))
                .then_some(Some(digits))
        }
    }
}

fn int_range(expr: &str) -> Result<Option<Vec<String>>> {
    let Some((a, b, step)) = split_range(expr) else {
        return Ok(None);
    };
    let Some(step) = parse_step(step) else {
        return Ok(None);
    };
    if !is_int(a) || !is_int(b) {
        return Ok(None);
    }
    let bad = || FormatError::InvalidArgument(format!("range {{{expr}}} is out of bounds"));
    let padded = [a, b]
        .iter()
        .any(|s| *s != "0" && *s != "-0" && (s.starts_with('0') || s.starts_with("-0")));
    let width = if padded { a.len().max(b.len()) } else { 0 };
    let start: i64 = a.parse().map_err(|_| bad())?;
    let end: i64 = b.parse().map_err(|_| bad())?;
    // `int(step) or 1`: a zero step means one.
    let step: u64 = match step {
        Some(s) => s.parse::<u64>().map_err(|_| bad())?.max(1),
        None => 1,
    };
    let span = start.abs_diff(end);
    if span / step + 1 > MAX_EXPANDED_URLS {
        return Err(too_many(expr));
    }
    let n = span / step + 1;
    let values = (0..n).map(|i| {
        let offset = i128::from(i) * i128::from(step);
        if start < end {
            i128::from(start) + offset
        } else {
            i128::from(start) - offset
        }
    });
    Ok(Some(values.map(|v| format!("{v:0width$}")).collect()))
}

const ALPHABET: &[u8; 52] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

fn char_range(expr: &str) -> Option<Vec<String>> {
    let (a, b, step) = split_range(expr)?;
    let step = parse_step(step)?;
    let index = |s: &str| -> Option<usize> {
        let bytes = s.as_bytes();
        (bytes.len() == 1)
            .then(|| ALPHABET.iter().position(|&c| c == bytes[0]))
            .flatten()
    };
    let (start, end) = (index(a)?, index(b)?);
    let step = step.map_or(1, |s| s.parse::<usize>().unwrap_or(usize::MAX).max(1));
    let picked: Vec<usize> = if start < end {
        (start..=end).step_by(step).collect()
    } else {
        (end..=start).rev().step_by(step).collect()
    };
    Some(
        picked
            .into_iter()
            .map(|i| char::from(ALPHABET[i]).to_string())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bx(p: &str) -> Vec<String> {
        braceexpand(p).unwrap()
    }

    #[test]
    fn matches_the_braceexpand_doctests() {
        assert_eq!(bx("item{1..3}"), ["item1", "item2", "item3"]);
        assert_eq!(bx("{a..c}"), ["a", "b", "c"]);
        assert_eq!(
            bx("index.html{,.backup}"),
            ["index.html", "index.html.backup"]
        );
        assert_eq!(
            bx("python{2.{5..7},3.{2,3}}"),
            [
                "python2.5",
                "python2.6",
                "python2.7",
                "python3.2",
                "python3.3"
            ]
        );
        assert_eq!(bx("{07..10}"), ["07", "08", "09", "10"]);
        assert_eq!(bx("{a..g..2}"), ["a", "c", "e", "g"]);
        assert_eq!(bx("{4..1}"), ["4", "3", "2", "1"]);
        assert_eq!(bx("{2..-1}"), ["2", "1", "0", "-1"]);
        assert!(braceexpand("{1{2,3}").is_err());
        assert_eq!(bx(r"{1\{2,3}"), ["1{2", "3"]);
    }

    #[test]
    fn literal_groups_and_quirks() {
        assert_eq!(bx("a{x}b"), ["a{x}b"]);
        assert_eq!(bx("{}"), ["{}"]);
        assert_eq!(bx(""), [""]);
        assert_eq!(bx("}{"), ["}{"]);
        assert_eq!(bx("{-01..1}"), ["-01", "000", "001"]);
        assert_eq!(bx("{Z..a}"), ["Z", "a"]);
        let down: Vec<String> = "baZYXWVUTSRQPONMLKJIHGFEDCBA"
            .chars()
            .map(String::from)
            .collect();
        assert_eq!(bx("{b..A}"), down);
        assert_eq!(bx("{a..e..-2}"), ["a", "c", "e"]);
        assert_eq!(bx("{-3..3..2}"), ["-3", "-1", "1", "3"]);
        assert_eq!(bx("x{a,{b,c}d,}y"), ["xay", "xbdy", "xcdy", "xy"]);
        assert_eq!(bx(r"a\\b"), [r"a\b"]);
        assert_eq!(bx("a\\"), ["a\\"]);
        assert_eq!(bx("{,}"), ["", ""]);
        assert_eq!(bx("{a,b}{}"), ["a{}", "b{}"]);
        assert_eq!(bx("{0..4..0}"), ["0", "1", "2", "3", "4"]);
        assert_eq!(bx("{1..2}{a,b}"), ["1a", "1b", "2a", "2b"]);
    }

    #[test]
    fn urls_split_on_double_colon_and_substitute_env() {
        let lookup = |name: &str| (name == "ROOT").then(|| "s3://b/d".to_string());
        assert_eq!(
            expand_urls_with("${ROOT}/a-{0..1}.tar::b.tar", lookup).unwrap(),
            ["s3://b/d/a-0.tar", "s3://b/d/a-1.tar", "b.tar"]
        );
        assert!(expand_urls_with("${MISSING}/a.tar", lookup).is_err());
        assert_eq!(expand_urls_with("$x{1,2}", lookup).unwrap(), ["$x1", "$x2"]);
    }

    #[test]
    fn refuses_huge_ranges() {
        assert!(braceexpand("{0..99999999999}").is_err());
        assert!(braceexpand("{0..9999}{0..9999}").is_err());
    }
}
