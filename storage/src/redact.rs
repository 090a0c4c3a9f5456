//! Keeping secrets out of errors, logs and `Debug` output.
//!
//! Credentials travel in places that end up in messages: an Azure SAS token is part of every
//! request URL (`?sv=…&sig=…`), a presigned URL carries `X-Amz-Signature` and
//! `X-Amz-Security-Token`, and S3's `SignatureDoesNotMatch` reply echoes the canonical request
//! with the session token in it. `object_store` prints request URLs and reply bodies in its
//! errors. Everything this crate formats goes through [`redact`]; backend errors are rebuilt
//! by [`scrub`] at the crate edge, so that neither their message nor any error beneath them
//! (which `anyhow` and `{:#}` print too) holds a secret.
//!
//! Three nets, each cheap: values of sensitive query parameters, headers and `KEY=value`
//! pairs; the contents of S3's signature-debugging XML elements; and the literal values of
//! secrets this process was configured with ([`register_secret`], filled from the
//! environment when a store is built).

use std::borrow::Cow;
use std::sync::RwLock;

/// What a redacted value reads as.
pub const MASK: &str = "***";

/// Parameter, header and variable names whose value is a secret (compared case-insensitively;
/// `-` and `_` are the same).
const SENSITIVE_NAMES: &[&str] = &[
    "sig",
    "signature",
    "x-amz-signature",
    "x-amz-security-token",
    "x-goog-signature",
    "x-goog-credential",
    "sas-token",
    "sas-key",
    "token",
    "access-token",
    "refresh-token",
    "id-token",
    "session-token",
    "security-token",
    "client-secret",
    "secret",
    "secret-access-key",
    "password",
    "account-key",
    "access-key",
    "private-key",
    "authorization",
    "aws-secret-access-key",
    "aws-session-token",
    "azure-storage-sas-key",
    "azure-storage-sas-token",
    "azure-storage-token",
    "azure-storage-account-key",
    "azure-storage-access-key",
    "azure-storage-master-key",
    "azure-client-secret",
    "google-service-account-key",
];

/// S3's `SignatureDoesNotMatch` reply explains itself with the signed material.
const SENSITIVE_ELEMENTS: &[&str] = &[
    "SignatureProvided",
    "StringToSign",
    "StringToSignBytes",
    "CanonicalRequest",
    "CanonicalRequestBytes",
];

/// Secrets shorter than this are not matched literally (they would mask ordinary words);
/// the name-based rules still apply to them.
const MIN_LITERAL: usize = 8;

static SECRETS: RwLock<Vec<String>> = RwLock::new(Vec::new());

/// Adds `value` to the secrets masked wherever they appear in formatted text.
pub fn register_secret(value: &str) {
    let value = value.trim();
    if value.len() < MIN_LITERAL {
        return;
    }
    if let Ok(mut secrets) = SECRETS.write() {
        if !secrets.iter().any(|s| s == value) {
            secrets.push(value.to_owned());
        }
    }
}

/// True when an environment variable or option named `name` holds a secret.
pub fn is_sensitive_name(name: &str) -> bool {
    let name = normalise(name);
    let key_not_id = name.ends_with("-key") && !name.ends_with("-key-id");
    SENSITIVE_NAMES.contains(&name.as_str())
        || key_not_id
        || ["secret", "token", "password", "signature", "sas"]
            .iter()
            .any(|word| name.split('-').any(|part| part == *word))
}

fn normalise(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('_', "-")
}

/// `text` with every secret it may hold masked (module docs).
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    if let Ok(secrets) = SECRETS.read() {
        for secret in secrets.iter() {
            if out.contains(secret.as_str()) {
                out = Cow::Owned(out.replace(secret.as_str(), MASK));
            }
        }
    }
    for element in SENSITIVE_ELEMENTS {
        if let Some(masked) = mask_elements(&out, element) {
            out = Cow::Owned(masked);
        }
    }
    match mask_named_values(&out) {
        Some(masked) => Cow::Owned(masked),
        None => out,
    }
}

/// A URL or endpoint for display: its query values and any `user:password@` masked.
pub fn redact_url(url: &str) -> Cow<'_, str> {
    let text = redact(url);
    let Some((scheme, rest)) = text.split_once("://") else {
        return text;
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    match rest.get(..authority_end).and_then(|a| a.rfind('@')) {
        Some(at) => Cow::Owned(format!("{scheme}://{MASK}{}", rest.get(at..).unwrap_or(""))),
        None => text,
    }
}

/// `<Element>…</Element>` with its contents masked; `None` when there is none.
fn mask_elements(text: &str, element: &str) -> Option<String> {
    let (open, close) = (format!("<{element}>"), format!("</{element}>"));
    if !text.contains(&open) {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(&open) {
        let body = start + open.len();
        out.push_str(rest.get(..body).unwrap_or(""));
        out.push_str(MASK);
        // An unterminated element (a truncated body) is masked to the end.
        rest = match rest.get(body..).and_then(|r| r.find(&close)) {
            Some(end) => rest.get(body + end..).unwrap_or(""),
            None => "",
        };
    }
    out.push_str(rest);
    Some(out)
}

/// Masks the value after `name=` or `name:` for every sensitive name that starts a word.
fn mask_named_values(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    let mut changed = false;
    while i < bytes.len() {
        let starts_word = i == 0 || !is_name_byte(bytes[i - 1]);
        if !starts_word || !is_name_byte(bytes[i]) {
            i += 1;
            continue;
        }
        let name_end = (i..bytes.len())
            .find(|&j| !is_name_byte(bytes[j]))
            .unwrap_or(bytes.len());
        let name = text.get(i..name_end).unwrap_or("");
        let value_start = match bytes.get(name_end) {
            Some(b'=') => Some(name_end + 1),
            Some(b':') if bytes.get(name_end + 1) != Some(&b'/') => {
                // `header: value` and `header:value`; not `https://`.
                let mut v = name_end + 1;
                while bytes.get(v) == Some(&b' ') {
                    v += 1;
                }
                Some(v)
            }
            _ => None,
        };
        match value_start {
            Some(v) if SENSITIVE_NAMES.contains(&normalise(name).as_str()) => {
                let value_end = (v..bytes.len())
                    .find(|&j| ends_value(bytes[j]))
                    .unwrap_or(bytes.len());
                if value_end > v {
                    out.push_str(text.get(copied..v).unwrap_or(""));
                    out.push_str(MASK);
                    copied = value_end;
                    changed = true;
                }
                i = value_end.max(name_end);
            }
            _ => i = name_end,
        }
    }
    if !changed {
        return None;
    }
    out.push_str(text.get(copied..).unwrap_or(""));
    Some(out)
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

fn ends_value(b: u8) -> bool {
    b.is_ascii_whitespace() || matches!(b, b'&' | b'"' | b'\'' | b'<' | b'>' | b',' | b';' | b')')
}

/// An error whose message, and that of every error beneath it, was redacted into one line.
/// It has no source: the chain it replaces is what held the secrets.
struct Scrubbed(String);

impl std::fmt::Display for Scrubbed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Debug for Scrubbed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl std::error::Error for Scrubbed {}

/// The messages of `error` and its sources, redacted, each once (a message often repeats its
/// source's).
fn chain_text(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut current = error.source();
    while let Some(e) = current {
        let message = e.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        current = e.source();
    }
    redact(&text).into_owned()
}

fn scrubbed(source: &(dyn std::error::Error + Send + Sync + 'static)) -> Box<Scrubbed> {
    Box::new(Scrubbed(chain_text(source)))
}

/// `error` with the same variant (callers still match on `NotFound`, `AlreadyExists`…) and its
/// source chain replaced by one redacted message. Classify the error (status, transport kind)
/// before scrubbing it: the typed sources are gone afterwards.
pub fn scrub(error: object_store::Error) -> object_store::Error {
    use object_store::Error as E;
    match error {
        E::Generic { store, source } => E::Generic {
            store,
            source: scrubbed(&*source),
        },
        E::NotFound { path, source } => E::NotFound {
            path,
            source: scrubbed(&*source),
        },
        E::AlreadyExists { path, source } => E::AlreadyExists {
            path,
            source: scrubbed(&*source),
        },
        E::Precondition { path, source } => E::Precondition {
            path,
            source: scrubbed(&*source),
        },
        E::NotModified { path, source } => E::NotModified {
            path,
            source: scrubbed(&*source),
        },
        E::PermissionDenied { path, source } => E::PermissionDenied {
            path,
            source: scrubbed(&*source),
        },
        E::Unauthenticated { path, source } => E::Unauthenticated {
            path,
            source: scrubbed(&*source),
        },
        E::NotSupported { source } => E::NotSupported {
            source: scrubbed(&*source),
        },
        // Path errors, join errors and configuration keys hold no request or reply; a variant
        // added later is flattened into `Generic` rather than passed through unread.
        e @ (E::InvalidPath { .. }
        | E::JoinError { .. }
        | E::NotImplemented { .. }
        | E::UnknownConfigurationKey { .. }) => e,
        other => E::Generic {
            store: "object_store",
            source: Box::new(Scrubbed(chain_text(&other))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sas_and_presigned_query_values_are_masked() {
        let text = "Error performing GET http://127.0.0.1:1/acct/c/b?sv=2022-11-02&sig=SECRETSIG%2F== in 2ms";
        let r = redact(text);
        assert!(!r.contains("SECRETSIG"), "{r}");
        assert!(r.contains("sv=2022-11-02&sig=*** in 2ms"), "{r}");
        let presigned = "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIA%2F20240101&X-Amz-Security-Token=TOK123&X-Amz-Signature=abcdef";
        let r = redact(presigned);
        assert!(!r.contains("TOK123") && !r.contains("abcdef"), "{r}");
        assert!(r.contains("X-Amz-Credential=AKIA"), "not a secret: {r}");
    }

    #[test]
    fn headers_env_pairs_and_signature_xml_are_masked() {
        let text = "x-amz-security-token:TOKEN1\nAuthorization: AWS4-HMAC-SHA256 Credential=AKIA/x, Signature=SIG2 \
                    AWS_SECRET_ACCESS_KEY=SECRET3 <StringToSign>AWS4\nTOKEN4</StringToSign><CanonicalRequest>GET\nx-amz-security-token:TOKEN5</CanonicalRequest>";
        let r = redact(text);
        for secret in ["TOKEN1", "SIG2", "SECRET3", "TOKEN4", "TOKEN5"] {
            assert!(!r.contains(secret), "{secret} in {r}");
        }
        assert!(r.contains("Credential=AKIA/x"), "{r}");
    }

    #[test]
    fn ordinary_text_is_untouched() {
        for text in [
            "object not found: s3://b/data/shard.00000.mds",
            "Error performing GET http://127.0.0.1:9/b?list-type=2&prefix=ds%2F in 3ms",
            "https://example.com:443/path",
            "token bucket refilled",
        ] {
            assert!(matches!(redact(text), Cow::Borrowed(_)), "{text}");
        }
    }

    #[test]
    fn registered_secrets_are_masked_anywhere() {
        register_secret("Zq8-literal-secret-xyz");
        register_secret("short");
        let r = redact("invalid value \"Zq8-literal-secret-xyz\" for short key");
        assert_eq!(r, "invalid value \"***\" for short key");
    }

    #[test]
    fn url_userinfo_is_masked() {
        assert_eq!(
            redact_url("http://user:pass@127.0.0.1:9000/b"),
            "http://***@127.0.0.1:9000/b"
        );
        assert_eq!(redact_url("http://127.0.0.1:9000"), "http://127.0.0.1:9000");
    }

    #[test]
    fn names_that_hold_secrets() {
        for name in [
            "AWS_SECRET_ACCESS_KEY",
            "AWS_SESSION_TOKEN",
            "AZURE_STORAGE_SAS_KEY",
            "AZURE_STORAGE_ACCOUNT_KEY",
            "GOOGLE_SERVICE_ACCOUNT_KEY",
            "azure_client_secret",
        ] {
            assert!(is_sensitive_name(name), "{name}");
        }
        for name in [
            "AWS_ACCESS_KEY_ID",
            "AWS_REGION",
            "AWS_ENDPOINT_URL",
            "AZURE_STORAGE_ACCOUNT_NAME",
        ] {
            assert!(!is_sensitive_name(name), "{name}");
        }
    }

    #[test]
    fn scrub_keeps_the_variant_and_drops_the_chain() {
        let inner = std::io::Error::other("GET http://h/c/b?sig=LEAK failed");
        let e = scrub(object_store::Error::PermissionDenied {
            path: "b".into(),
            source: Box::new(inner),
        });
        assert!(matches!(e, object_store::Error::PermissionDenied { .. }));
        assert!(!format!("{e} {e:?}").contains("LEAK"));
        let source = std::error::Error::source(&e).unwrap();
        assert!(source.source().is_none());
    }
}
