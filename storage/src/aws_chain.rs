//! The AWS credential chain behind `object_store`'s S3 client, for locations opened without
//! explicit keys: the providers of `aws-config`, in the order every AWS SDK uses.
//!
//! 1. the shared config and credentials files, profile `AWS_PROFILE` (or the per-call
//!    `profile` option, else `default`): static keys, `credential_process`, SSO (the token
//!    cache `aws sso login` leaves in `~/.aws/sso/cache`), `role_arn` with a source profile or
//!    web identity;
//! 2. web identity (IRSA): `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN` through STS
//!    `AssumeRoleWithWebIdentity` (endpoint `AWS_ENDPOINT_URL_STS` when set);
//! 3. container credentials: ECS (`AWS_CONTAINER_CREDENTIALS_RELATIVE_URI`) and EKS Pod
//!    Identity or any loopback server (`AWS_CONTAINER_CREDENTIALS_FULL_URI`, with
//!    `AWS_CONTAINER_AUTHORIZATION_TOKEN[_FILE]`);
//! 4. the EC2 instance metadata service (IMDSv2), unless `AWS_EC2_METADATA_DISABLED=true`;
//!    endpoint `AWS_EC2_METADATA_SERVICE_ENDPOINT`.
//!
//! Keys in the environment (`AWS_ACCESS_KEY_ID`...) or in the per-call options never reach
//! this chain: `object_store` signs with them directly.
//!
//! Profile name, file paths, web identity settings and the metadata switches are read from
//! the [`Env`] the location is opened with. The container provider and the STS client's
//! endpoint are read by `aws-config` from the process environment (it offers no way to pass
//! them in); for a process opened with [`Env::from_process`] the two are the same.
//!
//! Credentials are cached until five minutes before they expire. When every source comes back
//! empty, the request fails before anything is sent to the bucket, with an error that names
//! what was looked at.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use aws_config::ecs::EcsCredentialsProvider;
use aws_config::imds::credentials::ImdsCredentialsProvider;
use aws_config::meta::credentials::CredentialsProviderChain;
use aws_config::profile::ProfileFileCredentialsProvider;
use aws_config::provider_config::ProviderConfig;
use aws_config::web_identity_token::{StaticConfiguration, WebIdentityTokenCredentialsProvider};
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::ProvideCredentials;
use aws_runtime::env_config::file::{EnvConfigFileKind, EnvConfigFiles};
use aws_types::region::Region;
use object_store::aws::AwsCredential;
use object_store::CredentialProvider;

use crate::env::Env;
use crate::error::{Result, StorageError};

/// Credentials this close to their expiry are fetched again.
const REFRESH_MARGIN: Duration = Duration::from_secs(300);

/// Where the chain looks, as resolved from the environment and options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSources {
    profile: String,
    config_file: PathBuf,
    credentials_file: PathBuf,
    web_identity: Option<(String, String)>,
    container: Option<String>,
    imds: Option<String>,
}

impl ChainSources {
    /// The sources for `env`, with `profile` (a per-call option) over `AWS_PROFILE`.
    pub(crate) fn resolve(env: &Env, profile: Option<&str>) -> Self {
        let home = env
            .get("HOME")
            .or_else(|| env.get("USERPROFILE"))
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("~"));
        let file = |var: &str, name: &str| {
            env.get(var)
                .map(PathBuf::from)
                .unwrap_or_else(|| home.join(".aws").join(name))
        };
        let imds_disabled = env
            .get("AWS_EC2_METADATA_DISABLED")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        Self {
            profile: profile
                .or_else(|| env.get("AWS_PROFILE"))
                .unwrap_or("default")
                .to_string(),
            config_file: file("AWS_CONFIG_FILE", "config"),
            credentials_file: file("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
            web_identity: env
                .get("AWS_WEB_IDENTITY_TOKEN_FILE")
                .zip(env.get("AWS_ROLE_ARN"))
                .map(|(f, r)| (f.to_string(), r.to_string())),
            container: env
                .get("AWS_CONTAINER_CREDENTIALS_FULL_URI")
                .or_else(|| env.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"))
                .map(|uri| crate::redact::redact_url(uri).into_owned()),
            imds: (!imds_disabled).then(|| {
                env.get("AWS_EC2_METADATA_SERVICE_ENDPOINT")
                    .unwrap_or("http://169.254.169.254")
                    .to_string()
            }),
        }
    }

    /// The profile's `region`, read from the config file (`[profile NAME]`, or `[default]`),
    /// else from the credentials file (`[NAME]`). `None` when unset or unreadable.
    pub(crate) fn profile_region(&self) -> Option<String> {
        let config_section = if self.profile == "default" {
            "default".to_string()
        } else {
            format!("profile {}", self.profile)
        };
        ini_value(&self.config_file, &config_section, "region")
            .or_else(|| ini_value(&self.credentials_file, &self.profile, "region"))
    }

    /// What was looked at, for the error when nothing was found. Worded so that the
    /// redaction rules (which mask the value after a secret's name) leave it whole.
    pub fn describe(&self) -> String {
        let state = |p: &PathBuf| if p.is_file() { "" } else { " (absent)" };
        let mut parts = vec![
            "the environment (no AWS_ACCESS_KEY_ID)".to_string(),
            format!(
                "profile {:?} in {}{} and {}{}",
                self.profile,
                self.config_file.display(),
                state(&self.config_file),
                self.credentials_file.display(),
                state(&self.credentials_file),
            ),
        ];
        parts.push(match &self.web_identity {
            Some((_, role)) => format!("web identity for role {role}"),
            None => "web identity (no AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN)".into(),
        });
        parts.push(match &self.container {
            Some(uri) => format!("container credentials at {uri}"),
            None => "container credentials (no AWS_CONTAINER_CREDENTIALS_FULL_URI or \
                     AWS_CONTAINER_CREDENTIALS_RELATIVE_URI)"
                .into(),
        });
        parts.push(match &self.imds {
            Some(endpoint) => format!("instance metadata at {endpoint}"),
            None => "instance metadata (disabled by AWS_EC2_METADATA_DISABLED)".into(),
        });
        parts.join("; ")
    }

    /// The profile files that exist (the SDK refuses a named file that does not).
    fn existing_files(&self) -> Option<EnvConfigFiles> {
        let config = self.config_file.is_file();
        let credentials = self.credentials_file.is_file();
        if !config && !credentials {
            return None;
        }
        let mut builder = EnvConfigFiles::builder();
        if config {
            builder = builder.with_file(EnvConfigFileKind::Config, &self.config_file);
        }
        if credentials {
            builder = builder.with_file(EnvConfigFileKind::Credentials, &self.credentials_file);
        }
        Some(builder.build())
    }
}

/// The value of `key` in `[section]` of an INI-style AWS file.
fn ini_value(path: &std::path::Path, section: &str, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut inside = false;
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
        } else if inside {
            if let Some((k, v)) = line.split_once('=') {
                if k.trim() == key && !v.trim().is_empty() {
                    return Some(v.trim().to_string());
                }
            }
        }
    }
    None
}

/// The profile link of a chain when neither profile file exists.
#[derive(Debug)]
struct NoProfileFiles;

impl ProvideCredentials for NoProfileFiles {
    fn provide_credentials<'a>(
        &'a self,
    ) -> aws_credential_types::provider::future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        aws_credential_types::provider::future::ProvideCredentials::ready(Err(
            CredentialsError::not_loaded("no shared config or credentials file"),
        ))
    }
}

/// No credentials, or a source that failed; kept as the source of `object_store`'s error so
/// that [`StorageError::from_backend`] can tell it from a transport failure.
#[derive(Debug, thiserror::Error)]
#[error("{}", redacted(.0))]
pub(crate) struct CredentialsUnavailable(pub(crate) String);

fn redacted(s: &str) -> String {
    crate::redact::redact(s).into_owned()
}

/// An `object_store` credential provider over the `aws-config` chain, with a cache.
#[derive(Debug)]
pub(crate) struct AwsChainProvider {
    chain: CredentialsProviderChain,
    sources: ChainSources,
    cache: tokio::sync::Mutex<Option<(Arc<AwsCredential>, Option<SystemTime>)>>,
}

impl AwsChainProvider {
    /// The chain over `sources`; `region` is the one STS is called in.
    pub(crate) fn new(sources: ChainSources, region: &str) -> Result<Self> {
        let conf =
            ProviderConfig::without_region().with_region(Some(Region::new(region.to_string())));
        // The chain needs a first link: the profile when its files exist, else nothing found.
        let mut chain = match sources.existing_files() {
            Some(files) => CredentialsProviderChain::first_try(
                "Profile",
                ProfileFileCredentialsProvider::builder()
                    .configure(&conf)
                    .profile_files(files)
                    .profile_name(&sources.profile)
                    .build(),
            ),
            None => CredentialsProviderChain::first_try("Profile", NoProfileFiles),
        };
        if let Some((token_file, role_arn)) = &sources.web_identity {
            let web = WebIdentityTokenCredentialsProvider::builder()
                .configure(&conf)
                .static_configuration(StaticConfiguration {
                    web_identity_token_file: PathBuf::from(token_file),
                    role_arn: role_arn.clone(),
                    session_name: format!("shardstream-{}", std::process::id()),
                })
                .build();
            chain = chain.or_else("WebIdentityToken", web);
        }
        chain = chain.or_else(
            "EcsContainer",
            EcsCredentialsProvider::builder().configure(&conf).build(),
        );
        if let Some(endpoint) = &sources.imds {
            let client = aws_config::imds::Client::builder()
                .configure(&conf)
                .endpoint(endpoint)
                .map_err(|e| StorageError::Config {
                    url: "$AWS_EC2_METADATA_SERVICE_ENDPOINT".into(),
                    reason: format!("invalid instance metadata endpoint {endpoint:?}: {e}"),
                })?
                .build();
            let imds = ImdsCredentialsProvider::builder()
                .configure(&conf)
                .imds_client(client)
                .build();
            chain = chain.or_else("Ec2InstanceMetadata", imds);
        }
        Ok(Self {
            chain,
            sources,
            cache: tokio::sync::Mutex::new(None),
        })
    }

    fn unavailable(&self, why: String) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: Box::new(CredentialsUnavailable(format!(
                "{why}; looked at: {}",
                self.sources.describe()
            ))),
        }
    }
}

#[async_trait::async_trait]
impl CredentialProvider for AwsChainProvider {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let mut cache = self.cache.lock().await;
        if let Some((credential, expiry)) = cache.as_ref() {
            let fresh = expiry.is_none_or(|at| {
                at.duration_since(SystemTime::now())
                    .is_ok_and(|left| left > REFRESH_MARGIN)
            });
            if fresh {
                return Ok(Arc::clone(credential));
            }
        }
        let found = self
            .chain
            .provide_credentials()
            .await
            .map_err(|e| match e {
                CredentialsError::CredentialsNotLoaded(_) => {
                    self.unavailable("no AWS credentials found".into())
                }
                other => self.unavailable(format!(
                    "AWS credentials could not be loaded: {}",
                    aws_smithy_error_chain(&other)
                )),
            })?;
        tracing::debug!("loaded AWS credentials from the chain");
        let credential = Arc::new(AwsCredential {
            key_id: found.access_key_id().to_string(),
            secret_key: found.secret_access_key().to_string(),
            token: found.session_token().map(String::from),
        });
        if let Some(token) = &credential.token {
            crate::redact::register_secret(token);
        }
        crate::redact::register_secret(&credential.secret_key);
        *cache = Some((Arc::clone(&credential), found.expiry()));
        Ok(credential)
    }
}

/// The error and its sources on one line.
fn aws_smithy_error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut current = e.source();
    while let Some(inner) = current {
        out.push_str(": ");
        out.push_str(&inner.to_string());
        current = inner.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_follow_the_environment() {
        let env = Env::from_pairs([
            ("HOME", "/home/u"),
            ("AWS_PROFILE", "prod"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ]);
        let s = ChainSources::resolve(&env, None);
        assert_eq!(s.profile, "prod");
        assert_eq!(s.config_file, PathBuf::from("/home/u/.aws/config"));
        assert_eq!(
            s.credentials_file,
            PathBuf::from("/home/u/.aws/credentials")
        );
        assert_eq!(s.imds, None);
        assert_eq!(ChainSources::resolve(&env, Some("dev")).profile, "dev");
        let text = s.describe();
        for needle in [
            "AWS_ACCESS_KEY_ID",
            "\"prod\"",
            "/home/u/.aws/config",
            "disabled",
        ] {
            assert!(text.contains(needle), "{needle} missing from {text}");
        }
        // Nothing in it looks like a secret to the redaction rules.
        assert_eq!(crate::redact::redact(&text), text);
        let with_sources = ChainSources::resolve(
            &Env::from_pairs([
                ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/token"),
                ("AWS_ROLE_ARN", "arn:aws:iam::1:role/r"),
                (
                    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                    "http://127.0.0.1:9/creds",
                ),
            ]),
            None,
        )
        .describe();
        assert_eq!(crate::redact::redact(&with_sources), with_sources);
        assert!(
            with_sources.contains("arn:aws:iam::1:role/r"),
            "{with_sources}"
        );
    }

    #[test]
    fn profile_region_comes_from_the_config_file() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config");
        std::fs::write(
            &config,
            "[default]\nregion = eu-west-1\n\n[profile prod]\noutput=json\nregion=ap-south-1\n",
        )
        .unwrap();
        let env = Env::from_pairs([("AWS_CONFIG_FILE", config.to_str().unwrap())]);
        let region = |p: Option<&str>| ChainSources::resolve(&env, p).profile_region();
        assert_eq!(region(None).as_deref(), Some("eu-west-1"));
        assert_eq!(region(Some("prod")).as_deref(), Some("ap-south-1"));
        assert_eq!(region(Some("other")), None);
    }
}
