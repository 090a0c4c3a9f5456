//! Listings that survive keys `object_store` cannot represent, and the one listing helper.
//!
//! S3, GCS and Azure accept any UTF-8 key, `ds//x`, `ds/../x` and `ds/a/./b` included. An
//! `object_store` [`Path`] refuses empty, `.` and `..` segments and control characters, and
//! its S3/GCS/Azure clients parse each listing *page* as a whole: one such key under a prefix
//! fails the entire listing with "Encountered object with invalid path", so a `download` or a
//! `ckpt gc` of an otherwise healthy root aborts. `object_store` cannot skip the key itself:
//! the page is lost before any entry reaches the caller.
//!
//! [`KeySafeStore`] wraps every remote store this crate builds. Its listings take the fast
//! path (the inner store's own) and, only on that error, fall back to paginated requests
//! ([`PaginatedListStore`]) from the last good key: the page size is halved until the page
//! holding the odd key is that key alone, the key is stepped over with `start-after`, and a
//! warning names it. Everything else passes straight through, so test decorators and the
//! checkpoint crate, which hold the store as `Arc<dyn ObjectStore>`, get the same listings.
//! A skipped key is never read, written or deleted (no [`Path`] can name it).
//!
//! [`list`] and [`list_dirs`] are the listing helpers every crate calls (the storage
//! [`Location`](crate::Location), checkpoint gc and catalog): sorted results, plus the keys
//! skipped on the way.
//!
//! Limits: the fallback relies on listings in key order with `start-after` (S3 general-purpose
//! buckets, GCS, Azure; not S3 Express directory buckets). Local directories are not wrapped: a
//! file name is always a valid path there, except names that are not UTF-8, which still fail.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use crate::decorate::Decorator;
use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use object_store::list::{PaginatedListOptions, PaginatedListStore};
use object_store::path::{self, Path, DELIMITER};
use object_store::{ListResult, ObjectMeta, ObjectStore};
use tracing::warn;

/// A key that a listing stepped over because `object_store` cannot represent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedKey {
    /// The key exactly as the store holds it (`ds//x`, `ds/../x`).
    pub key: String,
    /// Why `object_store` refused it.
    pub reason: String,
}

/// One listing: objects (sorted by path), "directories" (sorted) and the keys skipped.
#[derive(Debug, Default)]
pub struct Listing {
    /// Objects found.
    pub objects: Vec<ObjectMeta>,
    /// Common prefixes, for a listing by delimiter ([`list_dirs`]); empty otherwise.
    pub common_prefixes: Vec<Path>,
    /// Keys under the prefix that were skipped, each already logged as a warning.
    pub skipped: Vec<SkippedKey>,
}

/// Every object below `prefix`, recursively, sorted by path; keys the store holds but
/// `object_store` cannot represent are skipped and reported, never fatal.
pub async fn list(store: &dyn ObjectStore, prefix: &Path) -> object_store::Result<Listing> {
    let (objects, skipped) = collect_skipped(store.list(Some(prefix)).try_collect()).await;
    let mut objects: Vec<ObjectMeta> = objects?;
    objects.sort_by(|a, b| a.location.cmp(&b.location));
    Ok(Listing {
        objects,
        common_prefixes: Vec::new(),
        skipped,
    })
}

/// The objects and "directories" directly below `prefix` (one level, by `/`), sorted; odd keys
/// are skipped and reported as in [`list`].
pub async fn list_dirs(store: &dyn ObjectStore, prefix: &Path) -> object_store::Result<Listing> {
    let (result, skipped) = collect_skipped(store.list_with_delimiter(Some(prefix))).await;
    let ListResult {
        mut objects,
        mut common_prefixes,
        ..
    } = result?;
    objects.sort_by(|a, b| a.location.cmp(&b.location));
    common_prefixes.sort();
    Ok(Listing {
        objects,
        common_prefixes,
        skipped,
    })
}

tokio::task_local! {
    /// Where [`KeySafeStore`] reports skipped keys to the [`list`] / [`list_dirs`] call that
    /// polls it, through any decorators in between (they only forward the stream).
    static SKIPPED: RefCell<Vec<SkippedKey>>;
}

async fn collect_skipped<T>(fut: impl std::future::Future<Output = T>) -> (T, Vec<SkippedKey>) {
    SKIPPED
        .scope(RefCell::new(Vec::new()), async move {
            let out = fut.await;
            (out, SKIPPED.with(|s| s.take()))
        })
        .await
}

fn report(key: &str, reason: String) {
    warn!(
        key,
        reason = %reason,
        "skipped an object whose key object_store cannot represent (empty, `.` or `..` \
         segment, or a control character); it is not listed, read or deleted"
    );
    let skipped = SkippedKey {
        key: key.to_owned(),
        reason,
    };
    // Outside a `list`/`list_dirs` call (a caller listing the store directly) the warning
    // above is the only report.
    let _ = SKIPPED.try_with(|s| s.borrow_mut().push(skipped));
}

/// A remote store whose listings step over keys `object_store` refuses (module docs).
pub(crate) struct KeySafeStore {
    inner: Arc<dyn ObjectStore>,
    pages: Arc<dyn PaginatedListStore>,
}

impl KeySafeStore {
    /// Wraps a store that can also list page by page (S3, GCS, Azure).
    pub(crate) fn new<S: ObjectStore + PaginatedListStore>(store: S) -> Self {
        let store = Arc::new(store);
        Self {
            inner: Arc::clone(&store) as Arc<dyn ObjectStore>,
            pages: store,
        }
    }

    fn list_from(
        &self,
        prefix: Option<&Path>,
        offset: Option<&Path>,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        let fast = match offset {
            Some(offset) => self.inner.list_with_offset(prefix, offset),
            None => self.inner.list(prefix),
        };
        let state = Walk::Fast {
            fast,
            after: offset.map(|o| o.to_string()),
            pages: Arc::clone(&self.pages),
            prefix: page_prefix(prefix),
        };
        futures::stream::unfold(state, Walk::next).boxed()
    }
}

/// The state of one recursive listing: the inner store's stream until it meets an odd key,
/// then what the paginated fallback collected.
enum Walk {
    Fast {
        fast: BoxStream<'static, object_store::Result<ObjectMeta>>,
        /// The last key delivered (or the caller's offset): where the fallback resumes.
        after: Option<String>,
        pages: Arc<dyn PaginatedListStore>,
        prefix: Option<String>,
    },
    Rest(std::vec::IntoIter<ObjectMeta>),
    Done,
}

impl Walk {
    async fn next(self) -> Option<(object_store::Result<ObjectMeta>, Self)> {
        match self {
            Walk::Fast {
                mut fast,
                after,
                pages,
                prefix,
            } => match fast.next().await? {
                Ok(meta) => {
                    let after = Some(meta.location.to_string());
                    Some((
                        Ok(meta),
                        Walk::Fast {
                            fast,
                            after,
                            pages,
                            prefix,
                        },
                    ))
                }
                Err(object_store::Error::InvalidPath { .. }) => {
                    // The failed page never reached us, so nothing after `after` was seen.
                    match fall_back(&*pages, prefix.as_deref(), false, after).await {
                        Ok(rest) => Walk::Rest(rest.objects.into_iter()).next_rest(),
                        Err(e) => Some((Err(e), Walk::Done)),
                    }
                }
                Err(e) => Some((Err(e), Walk::Done)),
            },
            rest @ Walk::Rest(_) => rest.next_rest(),
            Walk::Done => None,
        }
    }

    fn next_rest(self) -> Option<(object_store::Result<ObjectMeta>, Self)> {
        match self {
            Walk::Rest(mut rest) => rest.next().map(|m| (Ok(m), Walk::Rest(rest))),
            _ => None,
        }
    }
}

/// A full page, as `object_store` and S3 request by default.
const FULL_PAGE: usize = 1000;

/// Lists `prefix` page by page from `after`, stepping over keys `object_store` refuses.
///
/// On a refused page the page size halves until the page is the odd key alone; the key (named
/// in the error) is reported and listing resumes after it. The size then doubles back, so a
/// run of odd keys costs about two requests each and a lone one about ten.
async fn fall_back(
    pages: &dyn PaginatedListStore,
    prefix: Option<&str>,
    delimiter: bool,
    mut after: Option<String>,
) -> object_store::Result<ListResult> {
    let mut out = ListResult {
        common_prefixes: Vec::new(),
        objects: Vec::new(),
        extensions: Default::default(),
    };
    let mut max_keys = FULL_PAGE / 2;
    let mut token: Option<String> = None;
    loop {
        let opts = PaginatedListOptions {
            offset: after.clone(),
            delimiter: delimiter.then_some(Cow::Borrowed(DELIMITER)),
            max_keys: Some(max_keys),
            page_token: token.clone(),
            ..Default::default()
        };
        match pages.list_paginated(prefix, opts).await {
            Ok(page) => {
                out.objects.extend(page.result.objects);
                out.common_prefixes.extend(page.result.common_prefixes);
                match page.page_token {
                    Some(next) => token = Some(next),
                    None => return Ok(out),
                }
                max_keys = (max_keys * 2).min(FULL_PAGE);
            }
            Err(object_store::Error::InvalidPath { .. }) if max_keys > 1 => max_keys /= 2,
            Err(object_store::Error::InvalidPath { source }) => {
                let Some(key) = refused_key(&source) else {
                    return Err(object_store::Error::InvalidPath { source });
                };
                let next = step_over(key, delimiter);
                // A store that does not list in key order would send us round in circles.
                if after.as_ref().is_some_and(|a| *a >= next) {
                    return Err(object_store::Error::InvalidPath { source });
                }
                report(key, source.to_string());
                after = Some(next);
                token = None;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The raw key inside a path error (as the store sent it).
fn refused_key(error: &path::Error) -> Option<&str> {
    match error {
        path::Error::EmptySegment { path }
        | path::Error::BadSegment { path, .. }
        | path::Error::NonUnicode { path, .. } => Some(path),
        _ => None,
    }
}

/// The `start-after` value that steps over `key`. A common prefix (`ds//`, by delimiter)
/// stands for every key below it: step past all of them, or the next page would roll them
/// up into the same prefix again.
fn step_over(key: &str, delimiter: bool) -> String {
    if delimiter && key.ends_with(DELIMITER) {
        format!("{key}{}", char::MAX)
    } else {
        key.to_owned()
    }
}

/// `prefix` as the paginated API wants it: with its trailing `/` (the trait methods add it).
fn page_prefix(prefix: Option<&Path>) -> Option<String> {
    prefix
        .filter(|p| !p.as_ref().is_empty())
        .map(|p| format!("{}{DELIMITER}", p.as_ref()))
}

/// The inner store's `Display` (`AmazonS3(bucket)`), not its `Debug`: object_store derives
/// that one, and it prints the static credentials (a SAS token, a secret key) in full.
impl fmt::Debug for KeySafeStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeySafeStore({})", self.inner)
    }
}

impl fmt::Display for KeySafeStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

#[async_trait]
impl Decorator for KeySafeStore {
    fn inner(&self) -> &Arc<dyn ObjectStore> {
        &self.inner
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.list_from(prefix, None)
    }

    fn list_with_offset(
        &self,
        prefix: Option<&Path>,
        offset: &Path,
    ) -> BoxStream<'static, object_store::Result<ObjectMeta>> {
        self.list_from(prefix, Some(offset))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> object_store::Result<ListResult> {
        match self.inner.list_with_delimiter(prefix).await {
            Err(object_store::Error::InvalidPath { .. }) => {
                let mut result =
                    fall_back(&*self.pages, page_prefix(prefix).as_deref(), true, None).await?;
                // As the inner store does: one entry per prefix, in order.
                let unique: BTreeSet<Path> = result.common_prefixes.drain(..).collect();
                result.common_prefixes = unique.into_iter().collect();
                Ok(result)
            }
            other => other,
        }
    }
}

crate::object_store_decorator!(KeySafeStore);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_over_a_key_or_everything_below_a_prefix() {
        assert_eq!(step_over("ds//x", false), "ds//x");
        assert_eq!(step_over("ds//", false), "ds//");
        let past = step_over("ds//", true);
        assert!(past.as_str() > "ds//zzz" && past.as_str() < "ds/0");
    }

    #[test]
    fn refused_key_is_the_raw_key() {
        let err = Path::parse("ds/../x").unwrap_err();
        assert_eq!(refused_key(&err), Some("ds/../x"));
        let err = Path::parse("ds//x").unwrap_err();
        assert_eq!(refused_key(&err), Some("ds//x"));
    }

    #[test]
    fn page_prefix_has_its_delimiter() {
        assert_eq!(
            page_prefix(Some(&Path::from("a/b"))).as_deref(),
            Some("a/b/")
        );
        assert_eq!(page_prefix(Some(&Path::ROOT)), None);
        assert_eq!(page_prefix(None), None);
    }
}
