//! Column specs: column name to MDS encoding name, and the `--columns name:enc,...` syntax.

use std::collections::BTreeMap;

use crate::error::{FormatError, Result};

/// Column name to MDS encoding name, in column-name order (the order MDS stores columns in).
pub type Columns = BTreeMap<String, String>;

/// Parses `name:encoding,name:encoding,...`.
///
/// An encoding may itself hold `:` and `,` (`ndarray:float32:3,224,224`): a comma-separated piece
/// without a `:` that is a number continues the previous column's shape. Names must be unique and
/// non-empty; encodings are checked by the reader or writer that uses them.
pub fn parse_columns(spec: &str) -> Result<Columns> {
    let bad = |why: String| FormatError::InvalidArgument(format!("columns {spec:?}: {why}"));
    let mut pairs: Vec<(String, String)> = Vec::new();
    for piece in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match piece.split_once(':') {
            Some((name, encoding)) => {
                let (name, encoding) = (name.trim(), encoding.trim());
                if name.is_empty() || encoding.is_empty() {
                    return Err(bad(format!("{piece:?} is not name:encoding")));
                }
                pairs.push((name.to_string(), encoding.to_string()));
            }
            None if piece.bytes().all(|b| b.is_ascii_digit()) => match pairs.last_mut() {
                Some((_, encoding)) if encoding.starts_with("ndarray:") => {
                    encoding.push(',');
                    encoding.push_str(piece);
                }
                _ => return Err(bad(format!("{piece:?} is not name:encoding"))),
            },
            None => return Err(bad(format!("{piece:?} is not name:encoding"))),
        }
    }
    if pairs.is_empty() {
        return Err(bad("no column given".into()));
    }
    let mut columns = Columns::new();
    for (name, encoding) in pairs {
        if columns.insert(name.clone(), encoding).is_some() {
            return Err(bad(format!("column {name:?} given twice")));
        }
    }
    Ok(columns)
}

/// Renders columns back as `name:encoding,...` (for logs and `--json` reports).
pub fn format_columns(columns: &Columns) -> String {
    columns
        .iter()
        .map(|(n, e)| format!("{n}:{e}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_shaped_columns() {
        let c = parse_columns("id:int, txt:str,x:ndarray:float32:3,224,224,y:ndarray").unwrap();
        assert_eq!(c["id"], "int");
        assert_eq!(c["txt"], "str");
        assert_eq!(c["x"], "ndarray:float32:3,224,224");
        assert_eq!(c["y"], "ndarray");
        assert_eq!(
            format_columns(&c),
            "id:int,txt:str,x:ndarray:float32:3,224,224,y:ndarray"
        );
    }

    #[test]
    fn refuses_malformed_specs() {
        for bad in ["", "id", "id:", ":int", "a:int,a:str", "a:int,3", "a:int,b"] {
            assert!(parse_columns(bad).is_err(), "{bad:?} accepted");
        }
    }
}
