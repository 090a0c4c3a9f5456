//! torchvision's `ImageFolder` layout: `ROOT/<class>/**/<image>`.
//!
//! Labels and order follow `torchvision.datasets.folder` exactly: classes are the sorted names of
//! `ROOT`'s sub-folders (label = position in that list); samples go class by class, and inside a
//! class folder by sub-folder path then file name (`sorted(os.walk(...))`, then `sorted(fnames)`);
//! only files whose lower-cased name ends with one of torchvision's `IMG_EXTENSIONS` count; files
//! directly in `ROOT` are ignored; a class folder without any image is an error, as torchvision's
//! default `allow_empty=False` makes it.
//!
//! Columns: `image` holds the original file bytes, encoded `jpeg` when every file has a `.jpg` or
//! `.jpeg` extension, `png` when every file is a `.png`, else `bytes`; `label` is an `int`; `path`
//! is the `str` path relative to `ROOT` (`cat/0001.jpg`). A file whose bytes do not match its
//! extension's magic number is kept as is, with a warning (PIL reads it either way).

use std::ops::Range;
use std::path::Path;

use super::walk::{walk_files_within, Entry};
use super::{clamp, columns_of, Columns, Input, InputFormat, SampleIter};
use crate::error::{FormatError, Result};
use crate::value::{ImageFormat, Sample, Value};

/// torchvision's `IMG_EXTENSIONS`.
pub const IMG_EXTENSIONS: [&str; 9] = [
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp",
];

/// Whether torchvision's `ImageFolder` would take a file of this name.
pub fn is_image_name(name: &str) -> bool {
    let lower = name.to_lowercase();
    IMG_EXTENSIONS.iter().any(|ext| lower.ends_with(ext))
}

#[derive(Debug)]
struct Item {
    entry: Entry,
    label: i64,
}

/// An ImageFolder tree as an [`Input`].
#[derive(Debug)]
pub struct ImageFolderInput {
    classes: Vec<String>,
    items: Vec<Item>,
    image_format: Option<ImageFormat>,
    columns: Columns,
}

impl ImageFolderInput {
    /// Lists the classes and images under `root`.
    pub fn open(root: &Path) -> Result<Self> {
        let invalid = |reason: String| FormatError::InvalidInput {
            path: root.display().to_string(),
            reason,
        };
        let mut classes = Vec::new();
        let listing = std::fs::read_dir(root).map_err(|e| FormatError::io(root, e))?;
        for entry in listing {
            let entry = entry.map_err(|e| FormatError::io(root, e))?;
            // `DirEntry.is_dir()` in Python follows symlinks; so does `Path::is_dir`.
            if entry.path().is_dir() {
                let name = entry
                    .file_name()
                    .into_string()
                    .map_err(|n| invalid(format!("class folder name {n:?} is not valid UTF-8")))?;
                classes.push(name);
            }
        }
        classes.sort_unstable();
        if classes.is_empty() {
            return Err(invalid(
                "no class folder found (an ImageFolder is ROOT/<class>/<image>)".into(),
            ));
        }
        let mut items = Vec::new();
        let mut empty = Vec::new();
        for (label, class) in classes.iter().enumerate() {
            let mut files: Vec<Entry> = walk_files_within(&root.join(class), root)?
                .into_iter()
                .filter(|e| is_image_name(file_name(&e.rel)))
                .map(|mut e| {
                    e.rel = format!("{class}/{}", e.rel);
                    e
                })
                .collect();
            if files.is_empty() {
                empty.push(class.clone());
            }
            // sorted(os.walk(...)) orders by folder path, then sorted(fnames) by name.
            files.sort_by(|a, b| split_parent(&a.rel).cmp(&split_parent(&b.rel)));
            items.extend(files.into_iter().map(|entry| Item {
                entry,
                label: label as i64,
            }));
        }
        if !empty.is_empty() {
            return Err(invalid(format!(
                "found no valid file for the classes {}; supported extensions are {}",
                empty.join(", "),
                IMG_EXTENSIONS.join(", ")
            )));
        }
        let image_format = common_format(items.iter().map(|i| file_name(&i.entry.rel)));
        let encoding = match image_format {
            Some(ImageFormat::Jpeg) => "jpeg",
            Some(ImageFormat::Png) => "png",
            None => "bytes",
        };
        tracing::info!(
            root = %root.display(),
            classes = classes.len(),
            images = items.len(),
            encoding,
            "listed ImageFolder"
        );
        Ok(ImageFolderInput {
            classes,
            items,
            image_format,
            columns: columns_of(&[("image", encoding), ("label", "int"), ("path", "str")]),
        })
    }

    /// The class names; a label is an index into this list.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }
}

impl Input for ImageFolderInput {
    fn format(&self) -> InputFormat {
        InputFormat::ImageFolder
    }

    fn columns(&self) -> &Columns {
        &self.columns
    }

    fn len(&self) -> u64 {
        self.items.len() as u64
    }

    fn read(&self, range: Range<u64>) -> Result<SampleIter<'_>> {
        let range = clamp(range, self.len());
        let slice = self
            .items
            .get(range.start as usize..range.end as usize)
            .unwrap_or_default();
        Ok(Box::new(slice.iter().map(move |item| {
            let path = &item.entry.path;
            let data = std::fs::read(path).map_err(|e| FormatError::io(path, e))?;
            let image = match self.image_format {
                Some(format) => {
                    if sniff(&data) != Some(format) {
                        tracing::warn!(path = %path.display(), expected = ?format, "image bytes do not match the file extension; kept as is");
                    }
                    Value::Image(format, data)
                }
                None => Value::Bytes(data),
            };
            let mut sample = Sample::new();
            sample.insert("image".into(), image);
            sample.insert("label".into(), Value::Int(item.label));
            sample.insert("path".into(), Value::Str(item.entry.rel.clone()));
            Ok(sample)
        })))
    }
}

/// The image format of a file's bytes, from its magic number.
pub fn sniff(data: &[u8]) -> Option<ImageFormat> {
    if data.starts_with(&[0xFF, 0xD8, 0xFF]) {
        Some(ImageFormat::Jpeg)
    } else if data.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some(ImageFormat::Png)
    } else {
        None
    }
}

/// The format every name's extension says, if they all agree on JPEG or on PNG.
fn common_format<'a>(mut names: impl Iterator<Item = &'a str>) -> Option<ImageFormat> {
    let of = |name: &str| {
        let lower = name.to_lowercase();
        if lower.ends_with(".jpg") || lower.ends_with(".jpeg") {
            Some(ImageFormat::Jpeg)
        } else if lower.ends_with(".png") {
            Some(ImageFormat::Png)
        } else {
            None
        }
    };
    let first = of(names.next()?)?;
    names.all(|n| of(n) == Some(first)).then_some(first)
}

fn file_name(rel: &str) -> &str {
    rel.rsplit('/').next().unwrap_or(rel)
}

fn split_parent(rel: &str) -> (&str, &str) {
    rel.rsplit_once('/').unwrap_or(("", rel))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torchvision_extensions_are_case_insensitive() {
        assert!(is_image_name("a.JPG"));
        assert!(is_image_name("b.webp"));
        assert!(!is_image_name("c.txt"));
        assert!(!is_image_name("jpg"));
    }

    #[test]
    fn common_format_needs_agreement() {
        assert_eq!(
            common_format(["a.jpg", "b.JPEG"].into_iter()),
            Some(ImageFormat::Jpeg)
        );
        assert_eq!(common_format(["a.png"].into_iter()), Some(ImageFormat::Png));
        assert_eq!(common_format(["a.png", "b.jpg"].into_iter()), None);
        assert_eq!(common_format(["a.bmp"].into_iter()), None);
    }

    #[test]
    fn folders_sort_before_their_subfolders_files() {
        // sorted(os.walk()) compares folder paths: "cat" < "cat/a" < "cat/a b" < "cat/a/c".
        let mut v = vec!["cat/a/c/w.jpg", "cat/a/x.jpg", "cat/z.jpg", "cat/a b/y.jpg"];
        v.sort_by(|a, b| split_parent(a).cmp(&split_parent(b)));
        assert_eq!(
            v,
            ["cat/z.jpg", "cat/a/x.jpg", "cat/a b/y.jpg", "cat/a/c/w.jpg"]
        );
    }
}
