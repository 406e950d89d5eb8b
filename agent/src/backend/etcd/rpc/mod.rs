//! A client of etcd's v3 gRPC API, of the calls this backend makes: over
//! tonic's channel (balanced over the members, TLS by rustls), with the
//! user's token, when there is a user, sent with every call and fetched
//! again when etcd says it expired (`--auth-token-ttl`).

mod messages;

pub use messages::{
    Compare, Get, KeyValue, RangeResponse, Txn, TxnOp, TxnResponse, Watch, WatchResponse,
};

use crate::backend::Secret;
use messages::{
    Authenticate, AuthenticateResponse, Delete, DeleteResponse, LeaseGrant, LeaseGrantResponse,
    LeaseKeepAlive, LeaseTimeToLive, LeaseTtl, Put, PutResponse, WatchRequest,
};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tonic::codec::Streaming;
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Request, Status};
use tonic_prost::ProstCodec;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// etcd's answer, or tonic's word that it could not get one (a status
    /// whose source is the transport's error).
    #[error("{:?}: {}", .0.code(), .0.message())]
    Status(#[from] Status),
    /// The channel was not ready for a call.
    #[error("{0}")]
    Transport(#[source] tonic::transport::Error),
    /// The channel could not be made: an endpoint or TLS setting it refused.
    #[error("{0}")]
    Setup(#[source] tonic::transport::Error),
    /// A keep-alive of a lease etcd no longer has.
    #[error("lease not found")]
    LeaseGone,
    /// A stream closed before its first answer.
    #[error("etcd closed {0}")]
    Ended(&'static str),
}

/// How to reach etcd.
pub struct Settings<'a> {
    /// `http://host:port` or `https://host:port`, one per member.
    pub endpoints: &'a [String],
    pub tls: Option<&'a ClientTlsConfig>,
    pub user: Option<&'a (String, Secret)>,
    pub connect_timeout: Duration,
    /// For one call's answer (a stream's first).
    pub timeout: Duration,
    /// HTTP/2 pings: every `.0`, a connection gone when one has no answer in `.1`.
    pub keep_alive: (Duration, Duration),
}

/// A connection to the cluster; clones share it, and the token.
#[derive(Clone)]
pub struct Client {
    channel: Channel,
    user: Option<(String, Secret)>,
    token: Arc<RwLock<Option<AsciiMetadataValue>>>,
    /// One token refresh at a time: calls refused together fetch one token.
    refreshing: Arc<tokio::sync::Mutex<()>>,
}

impl Client {
    /// Makes the channel (it connects at the first call) and, with a user,
    /// fetches the token: the one request made here.
    pub async fn connect(settings: Settings<'_>) -> Result<Client, Error> {
        let mut endpoints = Vec::with_capacity(settings.endpoints.len());
        for url in settings.endpoints {
            let mut endpoint = Endpoint::from_shared(url.clone()).map_err(Error::Setup)?;
            if let Some(tls) = settings.tls {
                endpoint = endpoint.tls_config(tls.clone()).map_err(Error::Setup)?;
            }
            let (interval, timeout) = settings.keep_alive;
            endpoints.push(
                endpoint
                    .connect_timeout(settings.connect_timeout)
                    .timeout(settings.timeout)
                    .http2_keep_alive_interval(interval)
                    .keep_alive_timeout(timeout)
                    .keep_alive_while_idle(true),
            );
        }
        let client = Client {
            channel: Channel::balance_list(endpoints.into_iter()),
            user: settings.user.cloned(),
            token: Arc::default(),
            refreshing: Arc::default(),
        };
        if client.user.is_some() {
            client.refresh(None).await?;
        }
        Ok(client)
    }

    pub async fn get(&self, get: Get) -> Result<RangeResponse, Error> {
        self.unary("/etcdserverpb.KV/Range", get).await
    }

    /// `lease`: the etcd lease the key goes on, if any.
    pub async fn put(
        &self,
        key: impl Into<Vec<u8>>,
        value: impl Into<Vec<u8>>,
        lease: Option<i64>,
    ) -> Result<(), Error> {
        let put = Put {
            key: key.into(),
            value: value.into(),
            lease: lease.unwrap_or(0),
        };
        let _: PutResponse = self.unary("/etcdserverpb.KV/Put", put).await?;
        Ok(())
    }

    /// Deletes one key: how many went (0 or 1).
    pub async fn delete(&self, key: impl Into<Vec<u8>>) -> Result<i64, Error> {
        let delete = Delete { key: key.into() };
        let answer: DeleteResponse = self.unary("/etcdserverpb.KV/DeleteRange", delete).await?;
        Ok(answer.deleted)
    }

    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, Error> {
        self.unary("/etcdserverpb.KV/Txn", txn).await
    }

    /// A new lease of `ttl` seconds: its id.
    pub async fn lease_grant(&self, ttl: i64) -> Result<i64, Error> {
        let answer: LeaseGrantResponse = self
            .unary("/etcdserverpb.Lease/LeaseGrant", LeaseGrant { ttl })
            .await?;
        Ok(answer.id)
    }

    /// Keeps lease `id` alive once: its TTL starts again.
    pub async fn lease_keep_alive(&self, id: i64) -> Result<(), Error> {
        let mut answers = self
            .call(|client, token| {
                let one = futures::stream::iter([LeaseKeepAlive { id }]);
                client.open_stream::<_, LeaseTtl, _>(
                    "/etcdserverpb.Lease/LeaseKeepAlive",
                    one,
                    token,
                )
            })
            .await?;
        match answers.message().await? {
            Some(answer) if answer.ttl > 0 => Ok(()),
            Some(_) => Err(Error::LeaseGone),
            None => Err(Error::Ended("the lease keep-alive stream")),
        }
    }

    /// The seconds lease `id` has left (at most 0: it is gone).
    pub async fn lease_time_to_live(&self, id: i64) -> Result<i64, Error> {
        let answer: LeaseTtl = self
            .unary(
                "/etcdserverpb.Lease/LeaseTimeToLive",
                LeaseTimeToLive { id },
            )
            .await?;
        Ok(answer.ttl)
    }

    /// Starts `watch`: its answers until etcd or the connection ends it.
    pub async fn watch(&self, watch: Watch) -> Result<Streaming<WatchResponse>, Error> {
        self.call(|client, token| {
            let create = WatchRequest {
                create: Some(watch.clone()),
            };
            // The request side stays open: etcd ends a watch whose client
            // has closed it.
            let requests = futures::StreamExt::chain(
                futures::stream::iter([create]),
                futures::stream::pending(),
            );
            client.open_stream("/etcdserverpb.Watch/Watch", requests, token)
        })
        .await
    }

    async fn unary<Q, A>(&self, path: &'static str, request: Q) -> Result<A, Error>
    where
        Q: prost::Message + Clone + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
    {
        self.call(|client, token| {
            let request = request.clone();
            async move {
                let mut grpc = client.ready().await?;
                let answer = grpc
                    .unary(
                        with_token(request, token),
                        path.parse().expect("a gRPC path"),
                        ProstCodec::<Q, A>::default(),
                    )
                    .await?;
                Ok(answer.into_inner())
            }
        })
        .await
    }

    async fn open_stream<Q, A, S>(
        self,
        path: &'static str,
        requests: S,
        token: Option<AsciiMetadataValue>,
    ) -> Result<Streaming<A>, Error>
    where
        Q: prost::Message + Send + Sync + 'static,
        A: prost::Message + Default + Send + Sync + 'static,
        S: futures::Stream<Item = Q> + Send + 'static,
    {
        let mut grpc = self.ready().await?;
        let answers = grpc
            .streaming(
                with_token(requests, token),
                path.parse().expect("a gRPC path"),
                ProstCodec::<Q, A>::default(),
            )
            .await?;
        Ok(answers.into_inner())
    }

    async fn ready(&self) -> Result<tonic::client::Grpc<Channel>, Error> {
        let mut grpc = tonic::client::Grpc::new(self.channel.clone());
        grpc.ready().await.map_err(Error::Transport)?;
        Ok(grpc)
    }

    /// Makes a call with the current token, and once more with a new one if
    /// etcd refused that token as expired.
    async fn call<T, F, Fut>(&self, call: F) -> Result<T, Error>
    where
        F: Fn(Client, Option<AsciiMetadataValue>) -> Fut,
        Fut: std::future::Future<Output = Result<T, Error>>,
    {
        let token = self.token.read().unwrap_or_else(|e| e.into_inner()).clone();
        match call(self.clone(), token.clone()).await {
            Err(Error::Status(status)) if self.user.is_some() && token_expired(&status) => {
                self.refresh(token).await?;
                let token = self.token.read().unwrap_or_else(|e| e.into_inner()).clone();
                call(self.clone(), token).await
            }
            answer => answer,
        }
    }

    /// Fetches a token for the user, unless another call has since `stale`.
    async fn refresh(&self, stale: Option<AsciiMetadataValue>) -> Result<(), Error> {
        let Some((name, password)) = &self.user else {
            return Ok(());
        };
        let _one = self.refreshing.lock().await;
        if *self.token.read().unwrap_or_else(|e| e.into_inner()) != stale {
            return Ok(());
        }
        let mut grpc = self.ready().await?;
        let credentials = Authenticate {
            name: name.clone(),
            password: password.expose().to_string(),
        };
        let answer = grpc
            .unary(
                Request::new(credentials),
                "/etcdserverpb.Auth/Authenticate"
                    .parse()
                    .expect("a gRPC path"),
                ProstCodec::<Authenticate, AuthenticateResponse>::default(),
            )
            .await?
            .into_inner();
        let token = AsciiMetadataValue::try_from(answer.token)
            .map_err(|_| Error::Status(Status::internal("etcd sent a token that is not ASCII")))?;
        *self.token.write().unwrap_or_else(|e| e.into_inner()) = Some(token);
        Ok(())
    }
}

/// `message` with the user's token, as etcd takes it: a `token` header.
fn with_token<T>(message: T, token: Option<AsciiMetadataValue>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        request.metadata_mut().insert("token", token);
    }
    request
}

/// etcd's word for a token it no longer takes: `Unauthenticated`, or, from
/// services that lose the code, its message.
fn token_expired(status: &Status) -> bool {
    match status.code() {
        Code::Unauthenticated => true,
        Code::Unknown => status.message().contains("invalid auth token"),
        _ => false,
    }
}
