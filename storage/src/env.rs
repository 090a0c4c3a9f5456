//! Environment rules: which variables configure which backend, and in what order they win.
//!
//! The environment is passed in as an [`Env`] value rather than read from the process inside
//! the rules, so tests inject variables without mutating the (shared, parallel) process env.
//!
//! S3 rules, in order of precedence (explicit [`StorageOptions`] always win):
//! - endpoint: `S3_ENDPOINT_URL` (the variable MosaicML Streaming reads, so a job switching
//!   from Mosaic keeps working), then `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, `AWS_ENDPOINT`;
//! - plain HTTP: `AWS_ALLOW_HTTP`; when unset, allowed automatically if the endpoint is
//!   `http://` on a loopback host (`localhost`, `127.0.0.0/8`, `[::1]`) — a local test server
//!   or sidecar proxy, where TLS buys nothing. Any other `http://` endpoint without
//!   `AWS_ALLOW_HTTP=true` is refused at open time with a message saying so;
//! - region: `AWS_REGION`, then `AWS_DEFAULT_REGION`, else `us-east-1` (what S3-compatible
//!   servers expect when none is configured);
//! - addressing: path-style (`endpoint/bucket/key`) whenever a custom endpoint is set, since
//!   MinIO, moto and most S3-compatible servers do not resolve `bucket.host` names;
//!   `AWS_VIRTUAL_HOSTED_STYLE_REQUEST` overrides;
//! - conditional put (`If-None-Match: *`, used by `put_if_absent`) is enabled; set
//!   `AWS_CONDITIONAL_PUT=disabled` for servers that reject it;
//! - region, when neither options nor `AWS_REGION`/`AWS_DEFAULT_REGION` name one: the
//!   profile's `region` in the shared config file, as the AWS SDKs do;
//! - credentials: keys (`AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`)
//!   sign directly; without keys the AWS credential chain is used (profiles, SSO, web
//!   identity, container, instance metadata: [`crate::aws_chain`]); `AWS_SKIP_SIGNATURE=true`
//!   or the `anon` option sends unsigned requests. Per-call credentials (options) replace
//!   every credential variable of the environment rather than mixing with them;
//! - every other `AWS_*` variable `object_store` knows (checksum algorithm, request payer,
//!   ...) is passed through, and per-call `object_store` keys are applied after them.
//!
//! GCS reads `GOOGLE_*` (e.g. `GOOGLE_APPLICATION_CREDENTIALS`, `GOOGLE_SERVICE_ACCOUNT`,
//! `GOOGLE_BASE_URL`), Azure reads `AZURE_*` (e.g. `AZURE_STORAGE_ACCOUNT_NAME`,
//! `AZURE_STORAGE_ACCOUNT_KEY`, `AZURE_STORAGE_USE_EMULATOR`).

use std::collections::BTreeMap;

use object_store::aws::{AmazonS3ConfigKey, S3ConditionalPut};

use crate::aws_chain::ChainSources;
use crate::error::{Result, StorageError};
use crate::options::StorageOptions;

/// A snapshot of environment variables.
///
/// Its `Debug` output masks the values of variables that hold secrets
/// ([`crate::redact::is_sensitive_name`]).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Env {
    vars: BTreeMap<String, String>,
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut map = f.debug_map();
        for (k, v) in &self.vars {
            if crate::redact::is_sensitive_name(k) {
                map.entry(k, &crate::redact::MASK);
            } else {
                map.entry(k, &crate::redact::redact_url(v));
            }
        }
        map.finish()
    }
}

impl Env {
    /// Registers the values of the variables that hold secrets with [`crate::redact`], so
    /// that they are masked wherever they might be echoed (a configuration error quoting a
    /// value, a reply body).
    pub(crate) fn register_secrets(&self) {
        for (k, v) in &self.vars {
            if crate::redact::is_sensitive_name(k) {
                crate::redact::register_secret(v);
            }
        }
    }

    /// The current process environment (variables that are not valid UTF-8 are skipped).
    pub fn from_process() -> Self {
        Self::from_pairs(std::env::vars_os().filter_map(|(k, v)| {
            let k = k.into_string().ok()?;
            let v = v.into_string().ok()?;
            Some((k, v))
        }))
    }

    /// An environment made of the given pairs (for tests and for explicit configuration).
    pub fn from_pairs<I, K, V>(pairs: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<String>,
        V: Into<String>,
    {
        Self {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        }
    }

    /// The value of `key`, if set to something other than blanks.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars
            .get(key)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// All variables whose name starts with `prefix`.
    pub fn with_prefix<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> {
        self.vars
            .iter()
            .filter(move |(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Parses a boolean variable (`true/false`, `1/0`, `yes/no`, `on/off`).
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        match value.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(Some(true)),
            "false" | "0" | "no" | "off" => Ok(Some(false)),
            _ => Err(StorageError::Config {
                url: format!("${key}"),
                reason: format!("{key}={value:?} is not a boolean (use true or false)"),
            }),
        }
    }
}

/// Endpoint variables in order of precedence.
const ENDPOINT_VARS: [&str; 4] = [
    "S3_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT",
];

/// Variables resolved by [`S3Settings::resolve`] itself rather than passed through.
const HANDLED_VARS: [&str; 7] = [
    "AWS_ENDPOINT_URL_S3",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT",
    "AWS_ALLOW_HTTP",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST",
];

/// The resolved S3 configuration (see the module docs for the rules).
///
/// Its `Debug` output names the passed-through keys but not their values (credentials).
#[derive(Clone, PartialEq)]
pub struct S3Settings {
    /// Custom endpoint, if any.
    pub endpoint: Option<String>,
    /// Whether plain HTTP is allowed.
    pub allow_http: bool,
    /// Region.
    pub region: String,
    /// Virtual-hosted-style (`bucket.host`) rather than path-style addressing.
    pub virtual_hosted: bool,
    /// Other `AWS_*` settings and per-call `object_store` keys, passed to `object_store`.
    pub passthrough: Vec<(AmazonS3ConfigKey, String)>,
    /// How requests are signed.
    pub credentials: AwsCredentials,
}

/// How S3 requests are signed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AwsCredentials {
    /// Keys given in the environment or options (`object_store` signs with them).
    Keys,
    /// Unsigned requests (`anon`, `AWS_SKIP_SIGNATURE`).
    Anonymous,
    /// The AWS credential chain ([`crate::aws_chain`]).
    Chain(Box<ChainSources>),
}

/// Keys that make up a credential: replaced as a whole by per-call credentials.
fn is_credential_key(key: &AmazonS3ConfigKey) -> bool {
    matches!(
        key,
        AmazonS3ConfigKey::AccessKeyId
            | AmazonS3ConfigKey::SecretAccessKey
            | AmazonS3ConfigKey::Token
            | AmazonS3ConfigKey::SkipSignature
            | AmazonS3ConfigKey::WebIdentityTokenFile
            | AmazonS3ConfigKey::RoleArn
            | AmazonS3ConfigKey::RoleSessionName
            | AmazonS3ConfigKey::ContainerCredentialsRelativeUri
            | AmazonS3ConfigKey::ContainerCredentialsFullUri
            | AmazonS3ConfigKey::ContainerAuthorizationTokenFile
    )
}

impl std::fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: Vec<&AmazonS3ConfigKey> = self.passthrough.iter().map(|(k, _)| k).collect();
        f.debug_struct("S3Settings")
            .field(
                "endpoint",
                &self.endpoint.as_deref().map(crate::redact::redact_url),
            )
            .field("allow_http", &self.allow_http)
            .field("region", &self.region)
            .field("virtual_hosted", &self.virtual_hosted)
            .field("passthrough_keys", &keys)
            .field("credentials", &self.credentials)
            .finish()
    }
}

impl S3Settings {
    /// Applies the rules to `env`, with `options` taking precedence.
    pub fn resolve(env: &Env, options: &StorageOptions) -> Result<Self> {
        let endpoint = options.endpoint.clone().or_else(|| {
            ENDPOINT_VARS
                .iter()
                .find_map(|k| env.get(k).map(String::from))
        });
        let loopback_http = match &endpoint {
            Some(e) => is_loopback_http(e)?,
            None => false,
        };
        let allow_http = match options.allow_http {
            Some(explicit) => explicit,
            None => env.get_bool("AWS_ALLOW_HTTP")?.unwrap_or(loopback_http),
        };
        if let Some(e) = &endpoint {
            if e.starts_with("http://") && !allow_http {
                return Err(StorageError::Config {
                    url: e.clone(),
                    reason: "plain-HTTP endpoint on a non-loopback host; set AWS_ALLOW_HTTP=true \
                             to allow it"
                        .into(),
                });
            }
        }
        let sources = ChainSources::resolve(env, options.profile.as_deref());
        let region = options
            .region
            .clone()
            .or_else(|| env.get("AWS_REGION").map(String::from))
            .or_else(|| env.get("AWS_DEFAULT_REGION").map(String::from))
            .or_else(|| sources.profile_region())
            .unwrap_or_else(|| "us-east-1".to_string());
        let virtual_hosted = env
            .get_bool("AWS_VIRTUAL_HOSTED_STYLE_REQUEST")?
            .unwrap_or(false);

        let per_call = option_keys(options)?;
        let per_call_credentials = options.anonymous.is_some()
            || options.profile.is_some()
            || per_call.iter().any(|(k, _)| is_credential_key(k));
        let mut passthrough = passthrough(env);
        if per_call_credentials {
            passthrough.retain(|(k, _)| !is_credential_key(k));
        }
        passthrough.extend(per_call);
        let skip_from_keys = passthrough
            .iter()
            .rev()
            .find(|(k, _)| *k == AmazonS3ConfigKey::SkipSignature)
            .map(|(_, v)| matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1"));
        passthrough.retain(|(k, _)| *k != AmazonS3ConfigKey::SkipSignature);
        let has = |key: AmazonS3ConfigKey| passthrough.iter().any(|(k, _)| *k == key);
        let credentials = if options.anonymous.or(skip_from_keys).unwrap_or(false) {
            AwsCredentials::Anonymous
        } else if has(AmazonS3ConfigKey::AccessKeyId) || has(AmazonS3ConfigKey::SecretAccessKey) {
            AwsCredentials::Keys
        } else {
            AwsCredentials::Chain(Box::new(sources))
        };
        Ok(Self {
            endpoint,
            allow_http,
            region,
            virtual_hosted,
            passthrough,
            credentials,
        })
    }

    /// Whether no request of the client can use TLS: a plain-`http://` endpoint with static
    /// keys (no credential provider reaches STS or a metadata service over HTTPS). Such a
    /// client need not load the system's root certificates, which costs milliseconds each
    /// time a client is built (every process of a DataLoader builds its own).
    pub fn plain_http_only(&self) -> bool {
        let http_endpoint = self
            .endpoint
            .as_deref()
            .is_some_and(|e| e.to_ascii_lowercase().starts_with("http://"));
        let has = |key: AmazonS3ConfigKey| self.passthrough.iter().any(|(k, _)| *k == key);
        let signing_without_provider = match self.credentials {
            AwsCredentials::Anonymous => true,
            AwsCredentials::Keys => {
                has(AmazonS3ConfigKey::AccessKeyId) && has(AmazonS3ConfigKey::SecretAccessKey)
            }
            AwsCredentials::Chain(_) => false,
        };
        self.allow_http && http_endpoint && signing_without_provider
    }

    /// Applies these settings to a builder that already has client and retry options.
    pub(crate) fn apply(
        &self,
        mut builder: object_store::aws::AmazonS3Builder,
    ) -> object_store::aws::AmazonS3Builder {
        builder = builder
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_skip_signature(self.credentials == AwsCredentials::Anonymous);
        for (key, value) in &self.passthrough {
            builder = builder.with_config(*key, value);
        }
        if let Some(endpoint) = &self.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        builder
            .with_region(&self.region)
            .with_virtual_hosted_style_request(self.virtual_hosted)
            .with_allow_http(self.allow_http)
    }
}

fn passthrough(env: &Env) -> Vec<(AmazonS3ConfigKey, String)> {
    env.with_prefix("AWS_")
        .filter(|(k, _)| !HANDLED_VARS.contains(k))
        .filter_map(|(k, v)| {
            let key = k.to_ascii_lowercase().parse::<AmazonS3ConfigKey>().ok()?;
            Some((key, v.to_string()))
        })
        .collect()
}

/// The per-call `object_store` keys, which must all be S3 keys.
fn option_keys(options: &StorageOptions) -> Result<Vec<(AmazonS3ConfigKey, String)>> {
    options
        .config
        .iter()
        .map(|(k, v)| {
            let key = k
                .parse::<AmazonS3ConfigKey>()
                .map_err(|_| StorageError::Config {
                    url: "storage options".into(),
                    reason: format!("{k:?} is not an S3 option"),
                })?;
            Ok((key, v.clone()))
        })
        .collect()
}

/// True for `http://localhost`, `http://127.x.y.z` and `http://[::1]` endpoints.
fn is_loopback_http(endpoint: &str) -> Result<bool> {
    let url = url::Url::parse(endpoint).map_err(|e| StorageError::Config {
        url: endpoint.to_string(),
        reason: format!("invalid endpoint URL: {e}"),
    })?;
    if url.scheme() != "http" {
        return Ok(false);
    }
    Ok(match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(pairs: &[(&str, &str)]) -> Result<S3Settings> {
        S3Settings::resolve(
            &Env::from_pairs(pairs.iter().copied()),
            &StorageOptions::default(),
        )
    }

    #[test]
    fn only_a_plain_http_endpoint_with_static_keys_skips_the_system_certificates() {
        let keys = [("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")];
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut pairs: Vec<(&str, &str)> = keys.to_vec();
            pairs.extend_from_slice(extra);
            resolve(&pairs).unwrap().plain_http_only()
        };
        assert!(with(&[("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")]));
        assert!(!with(&[("AWS_ENDPOINT_URL", "https://minio.example:9000")]));
        assert!(!with(&[]), "AWS itself is HTTPS");
        // Keys win over a web identity token: no provider runs.
        assert!(with(&[
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token"),
        ]));
        let no_keys = resolve(&[("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")]).unwrap();
        assert!(
            !no_keys.plain_http_only(),
            "a credential provider may call STS over HTTPS"
        );
    }

    #[test]
    fn no_env_means_aws_defaults() {
        let s = resolve(&[]).unwrap();
        assert_eq!(s.endpoint, None);
        assert!(!s.allow_http);
        assert_eq!(s.region, "us-east-1");
        assert!(!s.virtual_hosted);
        assert!(s.passthrough.is_empty());
    }

    #[test]
    fn mosaic_endpoint_variable_wins_over_aws_ones() {
        let s = resolve(&[
            ("AWS_ENDPOINT_URL", "https://aws.example"),
            ("S3_ENDPOINT_URL", "https://mosaic.example"),
        ])
        .unwrap();
        assert_eq!(s.endpoint.as_deref(), Some("https://mosaic.example"));
        let s = resolve(&[
            ("AWS_ENDPOINT_URL", "https://generic.example"),
            ("AWS_ENDPOINT_URL_S3", "https://s3.example"),
        ])
        .unwrap();
        assert_eq!(s.endpoint.as_deref(), Some("https://s3.example"));
    }

    #[test]
    fn loopback_http_is_allowed_automatically() {
        for e in [
            "http://127.0.0.1:9000",
            "http://127.1.2.3",
            "http://localhost:5000",
            "http://[::1]:8080",
        ] {
            let s = resolve(&[("AWS_ENDPOINT_URL", e)]).unwrap();
            assert!(s.allow_http, "{e}");
        }
        let s = resolve(&[("AWS_ENDPOINT_URL", "https://127.0.0.1")]).unwrap();
        assert!(!s.allow_http);
    }

    #[test]
    fn remote_http_needs_explicit_permission() {
        let err = resolve(&[("AWS_ENDPOINT_URL", "http://minio.svc:9000")]).unwrap_err();
        assert!(err.to_string().contains("AWS_ALLOW_HTTP"), "{err}");
        let s = resolve(&[
            ("AWS_ENDPOINT_URL", "http://minio.svc:9000"),
            ("AWS_ALLOW_HTTP", "true"),
        ])
        .unwrap();
        assert!(s.allow_http);
        // An explicit "false" beats the loopback rule.
        let err = resolve(&[
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
            ("AWS_ALLOW_HTTP", "false"),
        ])
        .unwrap_err();
        assert!(matches!(err, StorageError::Config { .. }));
    }

    #[test]
    fn bad_boolean_names_the_variable() {
        let err = resolve(&[("AWS_ALLOW_HTTP", "maybe")]).unwrap_err();
        assert!(err.to_string().contains("AWS_ALLOW_HTTP"), "{err}");
    }

    #[test]
    fn region_precedence() {
        let s = resolve(&[("AWS_DEFAULT_REGION", "eu-west-1")]).unwrap();
        assert_eq!(s.region, "eu-west-1");
        let s = resolve(&[
            ("AWS_DEFAULT_REGION", "eu-west-1"),
            ("AWS_REGION", "ap-south-1"),
        ])
        .unwrap();
        assert_eq!(s.region, "ap-south-1");
        let opts = StorageOptions::default().with_region("us-west-2");
        let s = S3Settings::resolve(&Env::from_pairs([("AWS_REGION", "x")]), &opts).unwrap();
        assert_eq!(s.region, "us-west-2");
    }

    #[test]
    fn explicit_options_beat_env() {
        let opts = StorageOptions::default()
            .with_endpoint("http://10.0.0.5:9000")
            .with_allow_http(true);
        let env = Env::from_pairs([("AWS_ENDPOINT_URL", "https://ignored.example")]);
        let s = S3Settings::resolve(&env, &opts).unwrap();
        assert_eq!(s.endpoint.as_deref(), Some("http://10.0.0.5:9000"));
        assert!(s.allow_http);
    }

    #[test]
    fn credentials_pass_through_and_handled_vars_do_not() {
        let s = resolve(&[
            ("AWS_ACCESS_KEY_ID", "AKIA"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("AWS_SESSION_TOKEN", "tok"),
            ("AWS_ENDPOINT_URL", "https://e.example"),
            ("AWS_REGION", "r"),
            ("AWS_SOMETHING_UNKNOWN", "x"),
            ("GOOGLE_APPLICATION_CREDENTIALS", "/x"),
        ])
        .unwrap();
        let keys: Vec<AmazonS3ConfigKey> = s.passthrough.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            keys,
            vec![
                AmazonS3ConfigKey::AccessKeyId,
                AmazonS3ConfigKey::SecretAccessKey,
                AmazonS3ConfigKey::Token
            ]
        );
    }

    #[test]
    fn debug_output_hides_credentials() {
        let s = resolve(&[("AWS_SECRET_ACCESS_KEY", "hunter2")]).unwrap();
        let text = format!("{s:?}");
        assert!(
            text.contains("SecretAccessKey") && !text.contains("hunter2"),
            "{text}"
        );
    }

    #[test]
    fn blank_values_count_as_unset() {
        let s = resolve(&[("AWS_ENDPOINT_URL", "  "), ("AWS_REGION", "")]).unwrap();
        assert_eq!(s.endpoint, None);
        assert_eq!(s.region, "us-east-1");
    }

    #[test]
    fn virtual_hosted_override() {
        let s = resolve(&[
            ("AWS_ENDPOINT_URL", "https://e.example"),
            ("AWS_VIRTUAL_HOSTED_STYLE_REQUEST", "true"),
        ])
        .unwrap();
        assert!(s.virtual_hosted);
    }
}
