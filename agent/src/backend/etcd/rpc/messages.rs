//! The messages of etcd's v3 gRPC API that this backend sends and reads,
//! written out for prost with etcd's own field numbers (etcd's
//! `etcdserverpb/rpc.proto` and `mvccpb/kv.proto`), so that building needs
//! no protobuf compiler. Only the fields used here are declared: prost skips
//! the others when decoding, and leaves them at etcd's defaults when encoding.
//! Names follow what the backend calls them, not the .proto's.

/// Every answer's header: the store revision it was made at.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResponseHeader {
    #[prost(int64, tag = "3")]
    pub revision: i64,
}

/// A key as stored (`mvccpb.KeyValue`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct KeyValue {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(int64, tag = "2")]
    create_revision: i64,
    #[prost(int64, tag = "3")]
    mod_revision: i64,
    #[prost(bytes = "vec", tag = "5")]
    value: Vec<u8>,
    #[prost(int64, tag = "6")]
    lease: i64,
}

impl KeyValue {
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    pub fn value(&self) -> &[u8] {
        &self.value
    }

    /// The store revision that created the key.
    pub fn create_revision(&self) -> i64 {
        self.create_revision
    }

    /// The store revision that last wrote the key.
    pub fn mod_revision(&self) -> i64 {
        self.mod_revision
    }

    /// The etcd lease the key is on; 0: none.
    pub fn lease(&self) -> i64 {
        self.lease
    }

    pub fn key_str(&self) -> Result<&str, std::str::Utf8Error> {
        std::str::from_utf8(&self.key)
    }
}

/// A read of one key, or of the keys from `key` up to `range_end` (`RangeRequest`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Get {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    /// Empty: `key` alone.
    #[prost(bytes = "vec", tag = "2")]
    pub range_end: Vec<u8>,
    /// 0: no limit.
    #[prost(int64, tag = "3")]
    pub limit: i64,
    #[prost(bool, tag = "8")]
    pub keys_only: bool,
}

impl Get {
    pub fn key(key: impl Into<Vec<u8>>) -> Get {
        Get {
            key: key.into(),
            ..Get::default()
        }
    }

    /// Every key that starts with this one.
    pub fn with_prefix(mut self) -> Get {
        self.range_end = prefix_end(&self.key);
        self
    }

    /// The keys from this one up to `end`, `end` not included.
    pub fn with_range(mut self, end: impl Into<Vec<u8>>) -> Get {
        self.range_end = end.into();
        self
    }

    pub fn with_limit(mut self, limit: i64) -> Get {
        self.limit = limit;
        self
    }

    pub fn with_keys_only(mut self) -> Get {
        self.keys_only = true;
        self
    }
}

/// The end of the range of keys that start with `prefix`: the prefix with its
/// last byte below 0xff incremented and what follows dropped; all keys (`\0`)
/// when there is no such byte, as etcd reads it.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    match prefix.iter().rposition(|&b| b < 0xff) {
        Some(last) => {
            let mut end = prefix[..=last].to_vec();
            end[last] += 1;
            end
        }
        None => vec![0],
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RangeResponse {
    #[prost(message, repeated, tag = "2")]
    pub kvs: Vec<KeyValue>,
    /// More keys were in the range than the limit let through.
    #[prost(bool, tag = "3")]
    pub more: bool,
}

/// `PutRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Put {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
    /// 0: on no lease.
    #[prost(int64, tag = "3")]
    pub lease: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PutResponse {}

/// `DeleteRangeRequest`, of one key.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Delete {
    #[prost(bytes = "vec", tag = "1")]
    pub key: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct DeleteResponse {
    /// How many keys went.
    #[prost(int64, tag = "2")]
    pub deleted: i64,
}

/// One condition of a transaction (`Compare`): every one here is equality.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Compare {
    /// `CompareResult`; 0 is `EQUAL`.
    #[prost(int32, tag = "1")]
    result: i32,
    /// `CompareTarget`: what of the key is compared.
    #[prost(int32, tag = "2")]
    target: i32,
    #[prost(bytes = "vec", tag = "3")]
    key: Vec<u8>,
    #[prost(oneof = "Compared", tags = "5, 6, 7, 8")]
    compared: Option<Compared>,
}

/// What a [`Compare`] expects (`Compare.target_union`).
#[derive(Clone, PartialEq, prost::Oneof)]
enum Compared {
    #[prost(int64, tag = "5")]
    CreateRevision(i64),
    #[prost(int64, tag = "6")]
    ModRevision(i64),
    #[prost(bytes = "vec", tag = "7")]
    Value(Vec<u8>),
    #[prost(int64, tag = "8")]
    Lease(i64),
}

impl Compare {
    fn equal(key: impl Into<Vec<u8>>, target: i32, compared: Compared) -> Compare {
        Compare {
            result: 0,
            target,
            key: key.into(),
            compared: Some(compared),
        }
    }

    /// The key was created at `revision` (0: the key does not exist).
    pub fn create_revision(key: impl Into<Vec<u8>>, revision: i64) -> Compare {
        Compare::equal(key, 1, Compared::CreateRevision(revision))
    }

    /// The key was last written at `revision` (0: the key does not exist).
    pub fn mod_revision(key: impl Into<Vec<u8>>, revision: i64) -> Compare {
        Compare::equal(key, 2, Compared::ModRevision(revision))
    }

    pub fn value(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Compare {
        Compare::equal(key, 3, Compared::Value(value.into()))
    }

    /// The key is on lease `lease`.
    pub fn lease(key: impl Into<Vec<u8>>, lease: i64) -> Compare {
        Compare::equal(key, 4, Compared::Lease(lease))
    }
}

/// One operation of a transaction (`RequestOp`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnOp {
    #[prost(oneof = "Op", tags = "1, 2, 3")]
    op: Option<Op>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum Op {
    #[prost(message, tag = "1")]
    Get(Get),
    #[prost(message, tag = "2")]
    Put(Put),
    #[prost(message, tag = "3")]
    Delete(Delete),
}

impl TxnOp {
    pub fn get(get: Get) -> TxnOp {
        TxnOp {
            op: Some(Op::Get(get)),
        }
    }

    /// `lease`: the etcd lease the key goes on, if any.
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>, lease: Option<i64>) -> TxnOp {
        TxnOp {
            op: Some(Op::Put(Put {
                key: key.into(),
                value: value.into(),
                lease: lease.unwrap_or(0),
            })),
        }
    }

    pub fn delete(key: impl Into<Vec<u8>>) -> TxnOp {
        TxnOp {
            op: Some(Op::Delete(Delete { key: key.into() })),
        }
    }
}

/// A transaction (`TxnRequest`): if every condition holds, the `and_then`
/// operations, else the `or_else` ones.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Txn {
    #[prost(message, repeated, tag = "1")]
    compare: Vec<Compare>,
    #[prost(message, repeated, tag = "2")]
    success: Vec<TxnOp>,
    #[prost(message, repeated, tag = "3")]
    failure: Vec<TxnOp>,
}

impl Txn {
    pub fn new() -> Txn {
        Txn::default()
    }

    pub fn when(mut self, conditions: impl IntoIterator<Item = Compare>) -> Txn {
        self.compare.extend(conditions);
        self
    }

    pub fn and_then(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Txn {
        self.success.extend(ops);
        self
    }

    pub fn or_else(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Txn {
        self.failure.extend(ops);
        self
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TxnResponse {
    #[prost(message, optional, tag = "1")]
    pub header: Option<ResponseHeader>,
    /// Whether the conditions held (the `and_then` branch ran).
    #[prost(bool, tag = "2")]
    pub succeeded: bool,
    #[prost(message, repeated, tag = "3")]
    responses: Vec<ResponseOp>,
}

impl TxnResponse {
    /// The store revision the transaction was made at.
    pub fn revision(&self) -> i64 {
        self.header.as_ref().map_or(0, |h| h.revision)
    }

    /// What each operation of the branch that ran read, in order (nothing
    /// for a put or a delete).
    pub fn reads(self) -> impl Iterator<Item = Vec<KeyValue>> {
        self.responses.into_iter().map(|r| match r.response {
            Some(OpResponse::Get(got)) => got.kvs,
            None => Vec::new(),
        })
    }

    /// The first key each operation read, if any: a read of one key's answer.
    pub fn firsts(self) -> impl Iterator<Item = Option<KeyValue>> {
        self.reads().map(|kvs| kvs.into_iter().next())
    }
}

/// `ResponseOp`: only a read's answer is declared, a put's or a delete's is
/// skipped (it says nothing used here).
#[derive(Clone, PartialEq, prost::Message)]
struct ResponseOp {
    #[prost(oneof = "OpResponse", tags = "1")]
    response: Option<OpResponse>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
enum OpResponse {
    #[prost(message, tag = "1")]
    Get(RangeResponse),
}

/// `LeaseGrantRequest`: a lease of `ttl` seconds, its id chosen by etcd.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrant {
    #[prost(int64, tag = "1")]
    pub ttl: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseGrantResponse {
    #[prost(int64, tag = "2")]
    pub id: i64,
}

/// `LeaseKeepAliveRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseKeepAlive {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// The answer to a keep-alive, and to a time-to-live request
/// (`LeaseKeepAliveResponse`, `LeaseTimeToLiveResponse`: the same numbers).
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseTtl {
    /// Seconds left (after a keep-alive: the lease's whole TTL); at most 0
    /// when etcd has no such lease.
    #[prost(int64, tag = "3")]
    pub ttl: i64,
}

/// `LeaseTimeToLiveRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LeaseTimeToLive {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `WatchRequest`, only ever a `create_request`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchRequest {
    #[prost(message, optional, tag = "1")]
    pub create: Option<Watch>,
}

/// `WatchCreateRequest`: the deletions of the keys under `key`, with each
/// key as it was before it went.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Watch {
    #[prost(bytes = "vec", tag = "1")]
    key: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    range_end: Vec<u8>,
    /// 0: from now.
    #[prost(int64, tag = "3")]
    start_revision: i64,
    /// `FilterType`s; 0 is `NOPUT`.
    #[prost(int32, repeated, tag = "5")]
    filters: Vec<i32>,
    #[prost(bool, tag = "6")]
    prev_kv: bool,
}

impl Watch {
    /// The deletions under `prefix` from `start_revision` on (0: from now).
    pub fn deletions_under(prefix: impl Into<Vec<u8>>, start_revision: i64) -> Watch {
        let key = prefix.into();
        Watch {
            range_end: prefix_end(&key),
            key,
            start_revision,
            filters: vec![0],
            prev_kv: true,
        }
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WatchResponse {
    #[prost(bool, tag = "3")]
    pub created: bool,
    #[prost(bool, tag = "4")]
    pub canceled: bool,
    /// Set when the watch was cancelled for starting at a compacted revision.
    #[prost(int64, tag = "5")]
    pub compact_revision: i64,
    #[prost(string, tag = "6")]
    pub cancel_reason: String,
    #[prost(message, repeated, tag = "11")]
    pub events: Vec<Event>,
}

/// `mvccpb.Event`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    /// `EventType`: 0 put, 1 delete.
    #[prost(int32, tag = "1")]
    pub kind: i32,
    #[prost(message, optional, tag = "2")]
    pub kv: Option<KeyValue>,
    #[prost(message, optional, tag = "3")]
    pub prev_kv: Option<KeyValue>,
}

impl Event {
    pub fn is_delete(&self) -> bool {
        self.kind == 1
    }
}

/// `AuthenticateRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Authenticate {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub password: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct AuthenticateResponse {
    #[prost(string, tag = "2")]
    pub token: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn a_prefix_ends_past_its_last_byte_below_ff() {
        assert_eq!(prefix_end(b"locks/"), b"locks0");
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }

    /// A condition on a zero (a key that does not exist) must still say what
    /// it compares: etcd reads a condition without its value as another one.
    #[test]
    fn a_condition_on_zero_is_sent() {
        let bytes = Compare::create_revision("k", 0).encode_to_vec();
        // target CREATE (field 2 = 1), key "k" (field 3), create_revision 0 (field 5).
        assert_eq!(bytes, [0x10, 1, 0x1a, 1, b'k', 0x28, 0]);
    }
}
