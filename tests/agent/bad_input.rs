//! Nothing is lost on bad input (DESIGN invariant 6): each kind of bad input
//! gets its error, the connection stays or closes as SPEC.md section 9 says,
//! and the agent keeps serving everyone else.

use crate::support::agent::Backend;
use crate::support::client::{acquire, encode, frame, hello, release, RawClient};
use crate::support::{key, TestAgent};
use anyhow::{bail, ensure, Context, Result};
use runlock_protocol::{
    AcquireRequest, AgentMessage, ClientMessage, Envelope, ErrorCode, ListKeysRequest,
    ReleaseRequest, WireError, MAX_FRAME_LEN,
};
use serde_json::json;

/// The error in `message`, or a failure naming what came instead.
fn error_of(message: &Envelope<AgentMessage>) -> Result<&WireError> {
    match &message.body {
        AgentMessage::Error(err) => Ok(err),
        other => bail!("expected an error, got {other:?}"),
    }
}

/// Fails unless `reply` is the error `code`.
fn expect_error(reply: &AgentMessage, code: ErrorCode) -> Result<()> {
    ensure!(
        matches!(reply, AgentMessage::Error(e) if e.code == code),
        "expected {code:?}, got {reply:?}"
    );
    Ok(())
}

/// Writes `bytes` as they are (a frame or not), and fails unless the reply is
/// the error `code` carrying the request id `id` (`None`: no id could be read).
async fn refused_with(
    client: &mut RawClient,
    bytes: &[u8],
    code: ErrorCode,
    id: Option<u64>,
) -> Result<()> {
    client.write_raw(bytes).await?;
    let reply = client.recv().await?;
    ensure!(error_of(&reply)?.code == code, "{reply:?}");
    ensure!(reply.id == id, "expected the id {id:?}: {reply:?}");
    Ok(())
}

/// Fails unless the connection still answers a ping.
async fn still_answers(client: &mut RawClient) -> Result<()> {
    match client.call(ClientMessage::Ping).await? {
        AgentMessage::Pong => Ok(()),
        other => bail!("expected pong, got {other:?}"),
    }
}

/// Fails unless a new connection can take a fresh key.
async fn agent_still_serves(agent: &TestAgent, name: &str) -> Result<()> {
    let mut client = agent.client().await?;
    let k = key(name);
    match client.call(acquire(&[&k])).await? {
        AgentMessage::Acquired { leases, .. } => {
            ensure!(leases.len() == 1 && leases[0].key == k, "{leases:?}");
            Ok(())
        }
        other => bail!("expected acquired, got {other:?}"),
    }
}

#[tokio::test]
async fn garbage_body_gets_bad_request_and_the_connection_keeps_working() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let mut client = agent.client().await?;
    for body in [
        &[0xc1u8][..],
        b"\xffnot msgpack at all",
        &[0x93, 1, 2, 3],
        &[],
    ] {
        refused_with(&mut client, &frame(body), ErrorCode::BadRequest, None)
            .await
            .with_context(|| format!("no id could be read from {body:?}"))?;
        still_answers(&mut client).await?;
    }
    // A map with a readable id but a bad field: the id is echoed.
    let bad_field = encode(&json!({"id": 41, "type": "acquire", "keys": 5}))?;
    refused_with(
        &mut client,
        &frame(&bad_field),
        ErrorCode::BadRequest,
        Some(41),
    )
    .await?;
    still_answers(&mut client).await?;
    agent_still_serves(&agent, "after-garbage").await
}

#[tokio::test]
async fn oversized_frame_closes_only_that_connection() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let mut bystander = agent.client().await?;
    let mut client = agent.client().await?;
    let oversized = ((MAX_FRAME_LEN as u32) + 1).to_be_bytes();
    refused_with(&mut client, &oversized, ErrorCode::BadRequest, None).await?;
    client.expect_closed().await?;

    // A length of exactly the limit is not oversized: the agent waits for the body.
    let mut at_limit = agent.client().await?;
    let body = encode(&json!({"id": 3, "type": "ping", "pad": "x".repeat(MAX_FRAME_LEN - 40)}))?;
    ensure!(
        body.len() <= MAX_FRAME_LEN,
        "test body too large: {}",
        body.len()
    );
    at_limit.write_raw(&frame(&body)).await?;
    let reply = at_limit.recv().await?;
    ensure!(
        reply == Envelope::request(3, AgentMessage::Pong),
        "{reply:?}"
    );

    still_answers(&mut bystander).await?;
    agent_still_serves(&agent, "after-oversized").await
}

#[tokio::test]
async fn unknown_message_type_gets_unsupported_with_its_id() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let mut client = agent.client().await?;
    let teleport = frame(&encode(
        &json!({"id": 7, "type": "teleport", "to": [1, 2]}),
    )?);
    refused_with(&mut client, &teleport, ErrorCode::Unsupported, Some(7)).await?;
    still_answers(&mut client).await?;
    agent_still_serves(&agent, "after-unknown-type").await
}

#[tokio::test]
async fn anything_before_hello_gets_bad_request_and_a_close() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let firsts = [
        frame(&encode(&json!({"id": 5, "type": "ping"}))?),
        frame(&encode(&json!({"id": 6, "type": "teleport"}))?),
        frame(&encode(
            &json!({"id": 8, "type": "acquire", "keys": ["k"]}),
        )?),
        frame(&[0xc1]),
    ];
    for (first, id) in firsts.iter().zip([Some(5), Some(6), Some(8), None]) {
        let mut client = RawClient::connect(agent.socket()).await?;
        refused_with(&mut client, first, ErrorCode::BadRequest, id).await?;
        client.expect_closed().await?;
    }
    agent_still_serves(&agent, "after-no-hello").await
}

#[tokio::test]
async fn hello_with_an_unknown_version_gets_unsupported_version_and_a_close() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let mut client = RawClient::connect(agent.socket()).await?;
    let ClientMessage::Hello {
        client: name, pid, ..
    } = hello()
    else {
        bail!("hello() is not a hello");
    };
    client
        .send_envelope(Envelope::event(ClientMessage::Hello {
            version: 99,
            client: name,
            pid,
            takes_locks: false,
        }))
        .await?;
    let reply = client.recv().await?;
    let err = error_of(&reply)?;
    ensure!(err.code == ErrorCode::UnsupportedVersion, "{reply:?}");
    client.expect_closed().await?;

    // A version beyond uint16 is undecodable: bad_request, and a close.
    let mut client = RawClient::connect(agent.socket()).await?;
    let wide = json!({"type": "hello", "version": 70000, "client": "x", "pid": 1});
    client.write_raw(&frame(&encode(&wide)?)).await?;
    let reply = client.recv().await?;
    ensure!(error_of(&reply)?.code == ErrorCode::BadRequest, "{reply:?}");
    client.expect_closed().await?;

    // A second hello on a live connection is refused, and the connection stays.
    let mut client = agent.client().await?;
    let id = client.send(hello()).await?;
    let reply = client.reply(id).await?;
    expect_error(&reply, ErrorCode::BadRequest)?;
    still_answers(&mut client).await?;
    agent_still_serves(&agent, "after-bad-hello").await
}

#[tokio::test]
async fn acquire_with_an_invalid_key_gets_invalid_key_naming_the_rule() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let mut client = agent.client().await?;
    let long = "k".repeat(513);
    for (bad, rule) in [
        ("", "empty"),
        (long.as_str(), "512"),
        ("a\u{1}b", "control"),
        ("a\u{85}b", "control"),
    ] {
        // A valid key beside the bad one must not be taken either.
        let good = key("beside-an-invalid-one");
        let reply = client.call(acquire(&[&good, bad])).await?;
        match &reply {
            AgentMessage::Error(err) => {
                ensure!(err.code == ErrorCode::InvalidKey, "{bad:?}: {reply:?}");
                // A key too long to be valid is echoed cut, so the error fits a frame.
                let echoed = err.key.as_deref().unwrap_or_default();
                let whole_or_cut = echoed == bad
                    || (echoed.len() <= 512
                        && echoed.ends_with("[cut]")
                        && bad.starts_with(&echoed[..100]));
                ensure!(whole_or_cut, "{bad:?}: {reply:?}");
                ensure!(
                    err.message.contains(rule),
                    "{bad:?}: the rule is not named: {reply:?}"
                );
            }
            other => bail!("{bad:?}: expected invalid_key, got {other:?}"),
        }
        let reply = client
            .call(ClientMessage::Inspect { key: good.clone() })
            .await?;
        ensure!(
            matches!(&reply, AgentMessage::Record(r) if r.state == runlock_protocol::KeyState::Free),
            "nothing may be taken when a key is invalid: {reply:?}"
        );
    }
    still_answers(&mut client).await?;
    agent_still_serves(&agent, "after-invalid-key").await
}

#[tokio::test]
async fn a_second_outstanding_acquire_is_refused_and_the_first_goes_on() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let k = key("outstanding");
    let mut holder = agent.client().await?;
    let AgentMessage::Acquired { leases, .. } = holder.call(acquire(&[&k])).await? else {
        bail!("the holder could not acquire");
    };
    let mut waiter = agent.client().await?;
    let first = waiter
        .send(ClientMessage::Acquire(AcquireRequest {
            slots: 1,
            keys: vec![k.clone()],
            ttl_ms: None,
            wait_ms: 10_000,
            force: false,
            command: String::new(),
            on_lost: Default::default(),
        }))
        .await?;
    let second = waiter.send(acquire(&["another-key"])).await?;
    let reply = waiter.reply(second).await?;
    expect_error(&reply, ErrorCode::BadRequest)?;

    let lease_ids = leases.into_iter().map(|l| l.lease_id).collect();
    let released = holder.call(release(lease_ids)).await?;
    ensure!(
        released == AgentMessage::Released { count: 1 },
        "{released:?}"
    );
    let reply = waiter.reply(first).await?;
    ensure!(
        matches!(&reply, AgentMessage::Acquired { leases, .. } if leases[0].key == k),
        "{reply:?}"
    );
    Ok(())
}

#[tokio::test]
async fn agent_keeps_its_leases_and_serves_through_all_bad_input() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let k = key("survivor");
    let mut holder = agent.client().await?;
    let AgentMessage::Acquired { .. } = holder.call(acquire(&[&k])).await? else {
        bail!("the holder could not acquire");
    };
    let abuse: Vec<Vec<u8>> = vec![
        frame(&encode(&json!({"id": 1, "type": "ping"}))?), // before hello
        frame(&[0xc1]),
        ((MAX_FRAME_LEN as u32) + 1).to_be_bytes().to_vec(),
        u32::MAX.to_be_bytes().to_vec(),
        frame(&encode(
            &json!({"type": "hello", "version": 99, "client": "x", "pid": 1}),
        )?),
        b"\x00\x00".to_vec(), // half a length header, then end of file
    ];
    for bytes in &abuse {
        let mut client = RawClient::connect(agent.socket()).await?;
        client.write_raw(bytes).await?;
    }
    for bytes in &abuse {
        let mut client = agent.client().await?;
        client.write_raw(bytes).await?;
        drop(client);
    }
    let reply = holder.call(ClientMessage::List).await?;
    let AgentMessage::Leases { leases, .. } = &reply else {
        bail!("expected leases, got {reply:?}");
    };
    ensure!(
        leases.iter().any(|l| l.key == k),
        "the holder lost its lease: {reply:?}"
    );
    still_answers(&mut holder).await?;
    agent_still_serves(&agent, "after-all-bad-input").await?;
    ensure!(
        !agent.log().contains("panicked"),
        "the agent panicked:\n{}",
        agent.log()
    );
    Ok(())
}

#[tokio::test]
async fn shim_refuses_invalid_keys_with_64_naming_the_rule() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let long = "k".repeat(513);
    for (bad, rule) in [
        ("", "must not be empty"),
        (long.as_str(), "at most 512 bytes"),
        ("tab\there", "control character"),
        ("nl\nhere", "control character"),
        ("night\u{200b}ly", "invisible character"),
        ("rtl\u{202e}here", "invisible character"),
    ] {
        let out = agent
            .runlock_output(&["run", "--key", bad, "--", "echo", "must-not-run"])
            .await?;
        out.expect_code(64)
            .with_context(|| format!("key {bad:?}"))?;
        ensure!(
            out.stderr.contains(rule),
            "key {bad:?}: the rule is not named: {out:?}"
        );
        ensure!(!out.stdout.contains("must-not-run"), "{out:?}");
        let out = agent.runlock_output(&["inspect", bad]).await?;
        out.expect_code(64)
            .with_context(|| format!("inspect {bad:?}"))?;
    }
    // A valid key of exactly 512 bytes is fine.
    let longest = "k".repeat(512);
    agent
        .runlock_output(&["run", "--key", &longest, "--", "true"])
        .await?
        .expect_code(0)
}

#[tokio::test]
async fn shim_usage_errors_exit_64() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    for args in [
        &["run", "--", "true"][..],
        &["run", "--key", "k"],
        &["run", "--key", "k", "--on-lost", "sometimes", "--", "true"],
        &["run", "--key", "k", "--wait", "forever", "--", "true"],
        &["run", "--key", "k", "--no-such-flag", "--", "true"],
        &["run", "--key", "k", "--ttl", "10ms", "--", "true"],
        &["frobnicate"],
        &["inspect"],
    ] {
        let out = agent.runlock_output(args).await?;
        out.expect_code(64)
            .with_context(|| format!("runlock {args:?}"))?;
        ensure!(
            !out.stderr.is_empty(),
            "runlock {args:?} says nothing: {out:?}"
        );
    }
    agent_still_serves(&agent, "after-usage-errors").await
}

/// A `list_keys` that goes on from `cursor`.
fn list_from(cursor: &str) -> ClientMessage {
    ClientMessage::ListKeys(ListKeysRequest {
        prefix: String::new(),
        cursor: Some(cursor.to_string()),
        free: true,
        events_since_ms: None,
    })
}

#[tokio::test]
async fn malformed_requests_get_bad_request_and_the_connection_stays() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let mut client = agent.client().await?;
    let with_ttl = |ttl_ms| {
        ClientMessage::Acquire(AcquireRequest {
            slots: 1,
            keys: vec![key("ttl")],
            ttl_ms: Some(ttl_ms),
            wait_ms: 0,
            force: false,
            command: String::new(),
            on_lost: Default::default(),
        })
    };
    for request in [
        acquire(&[]),
        with_ttl(999),
        with_ttl(86_400_001),
        release(Vec::new()),
        ClientMessage::Release(ReleaseRequest {
            slot: None,
            lease_ids: vec!["x".into()],
            key: Some("k".into()),
        }),
        // A listing cursor the agent never gave: malformed, oversized, or
        // of another shape.
        list_from(r#"{"page": 3"#),
        list_from(&"x".repeat(100_000)),
        list_from(r#"{"after": ["not", "a", "name"]}"#),
    ] {
        let reply = client.call(request.clone()).await?;
        expect_error(&reply, ErrorCode::BadRequest).with_context(|| format!("{request:?}"))?;
    }
    // A prefix no key can start with is refused as a key would be.
    let reply = client
        .call(ClientMessage::ListKeys(ListKeysRequest {
            prefix: "bad\u{1}prefix".into(),
            cursor: None,
            free: false,
            events_since_ms: None,
        }))
        .await?;
    expect_error(&reply, ErrorCode::InvalidKey)?;
    // An on_lost the agent does not know makes the body undecodable; its id is echoed.
    let odd = json!({"id": 77, "type": "acquire", "keys": ["k"], "on_lost": "shrug"});
    refused_with(
        &mut client,
        &frame(&encode(&odd)?),
        ErrorCode::BadRequest,
        Some(77),
    )
    .await?;
    // Unknown fields are ignored.
    let extra = json!({"id": 78, "type": "ping", "future": {"nested": [1, 2, 3]}});
    client.write_raw(&frame(&encode(&extra)?)).await?;
    let reply = client.recv().await?;
    ensure!(
        reply == Envelope::request(78, AgentMessage::Pong),
        "{reply:?}"
    );
    still_answers(&mut client).await?;
    agent_still_serves(&agent, "after-malformed").await
}

#[tokio::test]
async fn releasing_another_connections_lease_is_not_owner_and_releases_nothing() -> Result<()> {
    let agent = TestAgent::start_on(Backend::File).await?;
    let k = key("not-owner");
    let mut owner = agent.client().await?;
    let AgentMessage::Acquired { leases, .. } = owner.call(acquire(&[&k])).await? else {
        bail!("the owner could not acquire");
    };
    let theirs: Vec<String> = leases.into_iter().map(|l| l.lease_id).collect();
    let mut other = agent.client().await?;
    let AgentMessage::Acquired { leases, .. } = other.call(acquire(&[&key("mine")])).await? else {
        bail!("the other could not acquire");
    };
    // One foreign id among its own: nothing at all is released.
    let mut ids: Vec<String> = leases.into_iter().map(|l| l.lease_id).collect();
    ids.extend(theirs.iter().cloned());
    let reply = other.call(release(ids)).await?;
    expect_error(&reply, ErrorCode::NotOwner)?;
    ensure!(
        other.is_held(&key("mine")).await?,
        "its own lease was released"
    );
    ensure!(other.is_held(&k).await?, "the owner's lease was released");
    let reply = owner.call(release(theirs)).await?;
    ensure!(reply == AgentMessage::Released { count: 1 }, "{reply:?}");
    ensure!(!owner.is_held(&k).await?, "not released by its owner");
    Ok(())
}
