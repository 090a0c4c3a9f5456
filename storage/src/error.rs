//! The crate's one error type, and the conversion of `object_store` errors into it.
//!
//! Every variant names the object (its full URL) or the local path it concerns, so that a
//! message printed by the CLI is enough to find the culprit. Backend errors are converted once,
//! here, at the edge of the crate ([`StorageError::from_backend`]).

use std::error::Error as _;
use std::path::PathBuf;

use object_store::client::{HttpError, HttpErrorKind};

use crate::redact::{redact, redact_url, scrub};

/// Result alias used throughout the crate.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// Everything that can go wrong in the storage layer.
///
/// Its `Display` and `Debug` never hold a secret: URLs and reasons go through
/// [`crate::redact`], and backend errors are scrubbed when converted ([`Self::from_backend`]).
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The location string is not a URL or path we understand.
    #[error("invalid storage URL {:?}: {}", redact_url(.url), redact(.reason))]
    InvalidUrl {
        /// The string as given.
        url: String,
        /// Why it was refused.
        reason: String,
    },
    /// A relative key or path would escape its root, or is malformed (`..`, empty component...).
    #[error("unsafe object name {:?}: {reason}", redact(.name))]
    UnsafePath {
        /// The name as given.
        name: String,
        /// Why it was refused.
        reason: &'static str,
    },
    /// The store could not be configured (credentials, endpoint, options).
    #[error("cannot configure storage for {}: {}", redact_url(.url), redact(.reason))]
    Config {
        /// The location being opened.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The object does not exist.
    #[error("object not found: {}", redact_url(.url))]
    NotFound {
        /// Full URL of the object.
        url: String,
    },
    /// A create-only write found the object already there.
    #[error("object already exists: {}", redact_url(.url))]
    AlreadyExists {
        /// Full URL of the object.
        url: String,
    },
    /// The object changed between the requests of one multi-request read (its ETag moved).
    #[error("object changed while it was being read: {}", redact_url(.url))]
    Changed {
        /// Full URL of the object.
        url: String,
    },
    /// The object's size is not what an earlier request or the caller said it was.
    #[error("size mismatch for {}: expected {expected} bytes, got {actual}", redact_url(.url))]
    SizeMismatch {
        /// Full URL of the object.
        url: String,
        /// Bytes expected.
        expected: u64,
        /// Bytes seen.
        actual: u64,
    },
    /// The object is larger than the caller allows for it (an index or manifest read whole):
    /// refused from its size before its bytes are fetched.
    #[error("{} has {size} bytes, more than the {limit} allowed for it", redact_url(.url))]
    TooLarge {
        /// Full URL of the object.
        url: String,
        /// Its size.
        size: u64,
        /// The most the caller accepts.
        limit: u64,
    },
    /// Credentials were refused or missing.
    #[error("permission denied for {}: {source}", redact_url(.url))]
    PermissionDenied {
        /// Full URL of the object.
        url: String,
        /// The backend's error.
        #[source]
        source: object_store::Error,
    },
    /// A request (after its retries) ran out of time.
    #[error("timed out on {}: {source}", redact_url(.url))]
    Timeout {
        /// Full URL of the object.
        url: String,
        /// The backend's error.
        #[source]
        source: object_store::Error,
    },
    /// The server could not be reached at all (connection refused, DNS failure), after retries.
    #[error("cannot reach the storage server for {}: {source}", redact_url(.url))]
    Unreachable {
        /// Full URL of the object.
        url: String,
        /// The backend's error.
        #[source]
        source: object_store::Error,
    },
    /// The server refused the request with a 4xx status that no retry changes (a bad request,
    /// a range past the object's end, a method not allowed): not retried, not transient.
    /// 404, 412, 401 and 403 have variants of their own; 408 and 429 are transient.
    #[error("the storage server refused the request for {} (HTTP {status}): {source}", redact_url(.url))]
    Rejected {
        /// Full URL of the object.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The backend's error.
        #[source]
        source: object_store::Error,
    },
    /// Any other backend failure (5xx after retries, protocol errors, unsupported operations).
    #[error("storage request failed for {}: {source}", redact_url(.url))]
    Backend {
        /// Full URL of the object.
        url: String,
        /// The backend's error.
        #[source]
        source: object_store::Error,
    },
    /// The transfer was cancelled (its shared request semaphore was closed).
    #[error("transfer cancelled: {}", redact_url(.url))]
    Cancelled {
        /// Full URL of the object.
        url: String,
    },
    /// A local file operation failed.
    #[error("I/O error on {path}: {source}", path = path.display())]
    Io {
        /// The local path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A test harness (moto server, fault proxy) failed; only produced by the `testing` module.
    #[error("test harness: {}", redact(.reason))]
    Harness {
        /// What went wrong.
        reason: String,
    },
}

/// The variant's name and the (redacted) message: the derived form would print URLs and
/// reasons as they came.
impl std::fmt::Debug for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let variant = match self {
            Self::InvalidUrl { .. } => "InvalidUrl",
            Self::UnsafePath { .. } => "UnsafePath",
            Self::Config { .. } => "Config",
            Self::NotFound { .. } => "NotFound",
            Self::AlreadyExists { .. } => "AlreadyExists",
            Self::Changed { .. } => "Changed",
            Self::SizeMismatch { .. } => "SizeMismatch",
            Self::TooLarge { .. } => "TooLarge",
            Self::PermissionDenied { .. } => "PermissionDenied",
            Self::Timeout { .. } => "Timeout",
            Self::Unreachable { .. } => "Unreachable",
            Self::Rejected { .. } => "Rejected",
            Self::Backend { .. } => "Backend",
            Self::Cancelled { .. } => "Cancelled",
            Self::Io { .. } => "Io",
            Self::Harness { .. } => "Harness",
        };
        f.debug_tuple(variant).field(&self.to_string()).finish()
    }
}

impl StorageError {
    /// Converts a backend error about the object at `url` into a [`StorageError`].
    ///
    /// The error is classified first (its status and transport kind are read from its typed
    /// sources), then scrubbed of secrets ([`crate::redact::scrub`]).
    pub fn from_backend(url: impl Into<String>, source: object_store::Error) -> Self {
        let url = url.into();
        if let Some(missing) = credentials_unavailable(&source) {
            return Self::Config {
                url,
                reason: missing,
            };
        }
        match source {
            object_store::Error::NotFound { .. } => Self::NotFound { url },
            object_store::Error::AlreadyExists { .. } => Self::AlreadyExists { url },
            object_store::Error::Precondition { .. } => Self::Changed { url },
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => Self::PermissionDenied {
                url,
                source: scrub(source),
            },
            other => match (refused_status(&other, &url), http_error_kind(&other)) {
                (Some(status), _) => Self::Rejected {
                    url,
                    status,
                    source: scrub(other),
                },
                (None, Some(HttpErrorKind::Timeout)) => Self::Timeout {
                    url,
                    source: scrub(other),
                },
                (None, Some(HttpErrorKind::Connect)) => Self::Unreachable {
                    url,
                    source: scrub(other),
                },
                (None, _) => Self::Backend {
                    url,
                    source: scrub(other),
                },
            },
        }
    }

    /// Wraps a local I/O error with its path.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    /// True for errors a later retry might cure (timeouts, unreachable server, 5xx).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Self::Timeout { .. } | Self::Unreachable { .. } | Self::Backend { .. }
        )
    }
}

/// How `object_store` words a response with an error status (its `RequestError::Status`, which
/// it does not export): the status code follows.
const STATUS_PREFIX: &str = "Server returned non-2xx status code: ";
/// How it words the request that got it (its `RetryError`): the method and URI follow.
const REQUEST_PREFIX: &str = "Error performing ";
/// S3 error codes that come with a 4xx and yet may pass on a later try: throttling, a request
/// the server timed out, credentials being refreshed.
const RETRYABLE_CODES: &[&str] = &[
    "RequestTimeout",
    "ExpiredToken",
    "TokenRefreshRequired",
    "Throttling",
    "ThrottlingException",
    "SlowDown",
    "RequestLimitExceeded",
    "IDPCommunicationError",
];

/// The status of a 4xx reply to a request for the object at `url` itself that retrying cannot
/// change, found in the error's source chain. `None` for 408 and 429, for the S3 codes in
/// [`RETRYABLE_CODES`], and for a reply to any other request: the client's own requests for
/// credentials (STS answers throttling with a 400) fail the same way, and stay transient.
///
/// `object_store` keeps its retry error type private, so the request and the status are read
/// from what its `Display` prints; `tests/faults.rs` pins that wording against a real client,
/// and a change in it only makes these errors transient again, as they were before.
fn refused_status(err: &object_store::Error, url: &str) -> Option<u16> {
    let key = object_key(url)?;
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        let text = e.to_string();
        if let Some(at) = text.find(STATUS_PREFIX) {
            let (request, reply) = text.split_at(at);
            // The URI is percent-encoded (each store encodes its own set of characters); the
            // key is compared with it decoded.
            let about_the_object = request.find(REQUEST_PREFIX).is_some_and(|r| {
                request.get(r..).is_some_and(|req| {
                    percent_encoding::percent_decode_str(req)
                        .decode_utf8_lossy()
                        .contains(key)
                })
            });
            if !about_the_object {
                return None;
            }
            let status: u16 = reply.get(STATUS_PREFIX.len()..)?.get(..3)?.parse().ok()?;
            if RETRYABLE_CODES
                .iter()
                .any(|code| reply.contains(&format!("<Code>{code}</Code>")))
            {
                return None;
            }
            return ((400..500).contains(&status) && status != 408 && status != 429)
                .then_some(status);
        }
        current = e.source();
    }
    None
}

/// The object's key in `url` (`scheme://container/key`), as it appears in a request's URI once
/// that is percent-decoded.
fn object_key(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let (_, key) = rest.split_once('/')?;
    (!key.is_empty()).then_some(key)
}

/// Finds the transport error kind anywhere in the error's source chain.
///
/// `object_store` hides its retry error type, but the `HttpError` it wraps is public.
/// The message of a credential chain that found nothing (or failed), if that is the cause.
fn credentials_unavailable(err: &object_store::Error) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = err.source();
    while let Some(e) = current {
        if let Some(c) = e.downcast_ref::<crate::aws_chain::CredentialsUnavailable>() {
            return Some(c.to_string());
        }
        current = e.source();
    }
    None
}

fn http_error_kind(err: &object_store::Error) -> Option<HttpErrorKind> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = err.source();
    while let Some(e) = current {
        if let Some(http) = e.downcast_ref::<HttpError>() {
            return Some(http.kind());
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return Some(HttpErrorKind::Timeout);
            }
        }
        current = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_error(status: &str) -> object_store::Error {
        reply("GET http://127.0.0.1/b/data/shard.mds", status, "<Error/>")
    }

    fn reply(request: &str, status: &str, body: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: format!("{REQUEST_PREFIX}{request} in 2ms - {STATUS_PREFIX}{status}: {body}")
                .into(),
        }
    }

    #[test]
    fn a_4xx_for_another_request_or_with_a_retryable_code_stays_transient() {
        let cases = [
            // The client's own request for credentials (EKS web identity), throttled.
            reply(
                "POST https://sts.amazonaws.com/",
                "400 Bad Request",
                "<Error><Code>Throttling</Code></Error>",
            ),
            reply(
                "GET http://127.0.0.1/b/data/shard.mds",
                "400 Bad Request",
                "<Error><Code>RequestTimeout</Code></Error>",
            ),
            reply(
                "GET http://127.0.0.1/b/data/shard.mds",
                "400 Bad Request",
                "<Error><Code>ExpiredToken</Code></Error>",
            ),
        ];
        for source in cases {
            let err = StorageError::from_backend("s3://b/data/shard.mds", source);
            assert!(matches!(err, StorageError::Backend { .. }), "{err:?}");
            assert!(err.is_transient());
        }
    }

    #[test]
    fn a_4xx_status_is_refused_and_not_transient() {
        for (status, code) in [("400 Bad Request", 400), ("416 Range Not Satisfiable", 416)] {
            let err = StorageError::from_backend("s3://b/data/shard.mds", status_error(status));
            assert!(
                matches!(&err, StorageError::Rejected { url, status, .. } if url == "s3://b/data/shard.mds" && *status == code),
                "{err:?}"
            );
            assert!(!err.is_transient());
            assert!(err.to_string().contains(&format!("HTTP {code}")), "{err}");
        }
    }

    #[test]
    fn a_key_percent_encoded_in_the_request_is_recognised() {
        let source = reply(
            "GET http://127.0.0.1/b/data/a%20key%2C%20%C3%A9.mds",
            "400 Bad Request",
            "<Error/>",
        );
        let err = StorageError::from_backend("s3://b/data/a key, é.mds", source);
        assert!(matches!(err, StorageError::Rejected { .. }), "{err:?}");
    }

    #[test]
    fn throttling_timeouts_and_5xx_stay_transient() {
        for status in [
            "429 Too Many Requests",
            "408 Request Timeout",
            "503 Service Unavailable",
        ] {
            let err = StorageError::from_backend("s3://b/data/shard.mds", status_error(status));
            assert!(matches!(err, StorageError::Backend { .. }), "{err:?}");
            assert!(err.is_transient());
        }
    }

    #[test]
    fn not_found_keeps_the_url() {
        let err = StorageError::from_backend(
            "s3://b/k",
            object_store::Error::NotFound {
                path: "k".into(),
                source: "gone".into(),
            },
        );
        assert!(matches!(&err, StorageError::NotFound { url } if url == "s3://b/k"));
        assert_eq!(err.to_string(), "object not found: s3://b/k");
    }

    #[test]
    fn precondition_means_changed() {
        let err = StorageError::from_backend(
            "s3://b/k",
            object_store::Error::Precondition {
                path: "k".into(),
                source: "etag".into(),
            },
        );
        assert!(matches!(err, StorageError::Changed { .. }));
        assert!(!err.is_transient());
    }

    #[test]
    fn io_timeout_in_chain_is_a_timeout() {
        let source = object_store::Error::Generic {
            store: "test",
            source: Box::new(std::io::Error::new(std::io::ErrorKind::TimedOut, "slow")),
        };
        let err = StorageError::from_backend("s3://b/k", source);
        assert!(matches!(err, StorageError::Timeout { .. }));
        assert!(err.is_transient());
    }
}
