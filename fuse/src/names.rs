//! File names of the `samples/` view: `<index>.<column>.<ext>`, and the column that gives the
//! original relative paths for datasets made from a folder or an ImageFolder tree.
//!
//! Column names come from the index, so they are untrusted. A `/` or NUL in a directory entry
//! makes the kernel fail the whole listing with EIO, so [`escape_column`] writes them `%2F` and
//! `%00`; a column whose file names would still be unusable (longer than [`NAME_MAX`], or equal
//! to another column's after escaping) is left out of `samples/` with a warning, and every
//! other column is listed as usual ([`column_file_names`]).

use std::borrow::Cow;

/// The longest file name a lookup accepts (Linux `NAME_MAX`).
pub const NAME_MAX: usize = 255;

/// The file extension for a column of `encoding`.
pub fn extension(encoding: &str) -> &str {
    match encoding {
        "jpeg" => "jpg",
        "png" => "png",
        "str" | "str_int" | "str_float" | "str_decimal" => "txt",
        "json" => "json",
        "pkl" => "pkl",
        "bytes" => "bin",
        "list[pil]" | "list[jpeg]" | "list[png]" => "list",
        "jpeg_array" | "jpegarray" => "jpegarray",
        other => other.split(':').next().unwrap_or(other),
    }
}

/// How sample files are named, from the dataset's columns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Naming {
    /// `samples/<index>.<column>.<ext>`: one file per sample and column.
    ByIndex {
        /// Digits of the zero-padded index (so that names sort in sample order).
        width: usize,
    },
    /// `samples/<path>`: the original relative path (column `path`) holds the bytes of the data
    /// column (`image` of an ImageFolder tree, `data` of a folder of files).
    ByPath {
        /// Position of the `path` column.
        path_column: usize,
        /// Position of the column whose bytes the file holds.
        data_column: usize,
    },
    /// `samples/<index>.<field>[.<ext>]` from the source's listing of each sample's fields
    /// (WebDataset members `<key>.<ext>`, LitData leaves with their serializer's extension).
    Listed {
        /// Digits of the zero-padded index (so that names sort in sample order).
        width: usize,
    },
}

impl Naming {
    /// Picks the naming for columns `(name, encoding)` of a dataset of `num_samples` samples:
    /// by path for exactly the columns `shardstream shard` writes for an ImageFolder tree
    /// (`image`, `label`, `path`) or a folder of files (`path`, `data`), else by index.
    pub fn detect(columns: &[(String, String)], num_samples: u64, by_path: bool) -> Naming {
        let find = |name: &str| columns.iter().position(|(n, _)| n == name);
        let mut names: Vec<&str> = columns.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        let path = find("path").filter(|&i| columns[i].1 == "str");
        let data = match names.as_slice() {
            ["image", "label", "path"] => find("image"),
            ["data", "path"] => find("data"),
            _ => None,
        };
        match (by_path, path, data) {
            (true, Some(path_column), Some(data_column)) => Naming::ByPath {
                path_column,
                data_column,
            },
            _ => Naming::ByIndex {
                width: num_samples.saturating_sub(1).to_string().len(),
            },
        }
    }
}

/// The name of sample `index`'s column file.
pub fn sample_file_name(width: usize, index: u64, column: &str, encoding: &str) -> String {
    format!("{index:0width$}.{column}.{}", extension(encoding))
}

/// `name` as it appears in file names: `/` as `%2F` and NUL as `%00`, which no file name may
/// hold; any other name unchanged.
pub fn escape_column(name: &str) -> Cow<'_, str> {
    if !name.contains(['/', '\0']) {
        return Cow::Borrowed(name);
    }
    Cow::Owned(name.replace('/', "%2F").replace('\0', "%00"))
}

/// The column part of each column's file names (`columns` are `(name, encoding)` in index
/// order; `width` digits of sample index): the escaped name, or `None` for a column left out of
/// `samples/` because its names would pass [`NAME_MAX`] or another column already has them.
pub fn column_file_names(columns: &[(String, String)], width: usize) -> Vec<Option<String>> {
    let mut taken = std::collections::HashSet::new();
    columns
        .iter()
        .map(|(name, encoding)| {
            let escaped = escape_column(name).into_owned();
            // `<index>.<column>.<ext>`: the longest index has `width` digits.
            let longest = width + escaped.len() + extension(encoding).len() + 2;
            let reason = if longest > NAME_MAX {
                "its file names would be longer than 255 bytes"
            } else if !taken.insert((escaped.clone(), extension(encoding).to_string())) {
                "its escaped name is another column's"
            } else {
                if escaped != *name {
                    tracing::warn!(column = ?name, listed_as = %escaped, "column name escaped in samples/");
                }
                return Some(escaped);
            };
            tracing::warn!(column = ?name, reason, "column left out of samples/");
            None
        })
        .collect()
}

/// The sample index a by-index name starts with (its digits before the first dot).
pub fn parse_index(name: &str) -> Option<u64> {
    let digits = name.split('.').next()?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cols(spec: &[(&str, &str)]) -> Vec<(String, String)> {
        spec.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn imagefolder_and_files_columns_are_named_by_path() {
        let image = cols(&[("image", "jpeg"), ("label", "int"), ("path", "str")]);
        assert_eq!(
            Naming::detect(&image, 10, true),
            Naming::ByPath {
                path_column: 2,
                data_column: 0
            }
        );
        let files = cols(&[("path", "str"), ("data", "bytes")]);
        assert_eq!(
            Naming::detect(&files, 10, true),
            Naming::ByPath {
                path_column: 0,
                data_column: 1
            }
        );
        assert_eq!(
            Naming::detect(&files, 1000, false),
            Naming::ByIndex { width: 3 }
        );
        let other = cols(&[("path", "str"), ("data", "bytes"), ("x", "int")]);
        assert_eq!(
            Naming::detect(&other, 1, true),
            Naming::ByIndex { width: 1 }
        );
    }

    /// Issue 40, row 11: a column name holding `/` or NUL is escaped, a too long one is left
    /// out, and the other columns keep their names.
    #[test]
    fn bad_column_names_are_escaped_or_left_out() {
        let long = "x".repeat(250);
        let columns = cols(&[
            ("a/b", "bytes"),
            ("a%2Fb", "bytes"),
            ("id", "int"),
            ("n\0ul", "str"),
            (&long, "bytes"),
        ]);
        let names = column_file_names(&columns, 3);
        assert_eq!(
            names,
            [
                Some("a%2Fb".to_string()),
                None,
                Some("id".to_string()),
                Some("n%00ul".to_string()),
                None
            ]
        );
    }

    #[test]
    fn names_round_trip_their_index() {
        let name = sample_file_name(5, 42, "image", "jpeg");
        assert_eq!(name, "00042.image.jpg");
        assert_eq!(parse_index(&name), Some(42));
        assert_eq!(parse_index("x.image.jpg"), None);
        assert_eq!(parse_index(".jpg"), None);
        assert_eq!(extension("ndarray:uint8:2,2"), "ndarray");
    }
}
