//! The trust boundary: a member of the socket group (`nobody`, through
//! `setpriv`) attacks the real agent with connections, partial frames,
//! malformed bodies and oversized fields. Each attack fails, and the agent
//! goes on serving everyone else.

use crate::support::client::{acquire, encode, frame, hello, RawClient};
use crate::support::run::{Finished, HOLD};
use crate::support::{key, setpriv, Run, TestAgent};
use crate::trust::access::{agent, as_nobody, NOBODY, RUNLOCK_GROUP};
use anyhow::{bail, ensure, Context, Result};
use runlock_protocol::{
    AgentMessage, ClientMessage, Envelope, ErrorCode, ReleaseRequest, WireError,
};

/// A small per-user cap and a short handshake, so the attacks are quick;
/// `warn` would let a run go ahead unlocked if the agent seemed unreachable.
const LIMITS: &str = "on_unavailable = \"warn\"\n[limits]\nconnections_per_user = 8\n\
                      handshake_timeout = \"1s\"\n";
/// A second unprivileged member of the socket group, with no passwd entry.
const OTHER: u32 = 4244;

async fn limited_agent() -> Result<TestAgent> {
    agent(LIMITS).await
}

/// A raw connection from `nobody`, a member of the socket group.
async fn member(agent: &TestAgent) -> Result<RawClient> {
    RawClient::connect_as(agent.socket(), NOBODY, NOBODY, &[RUNLOCK_GROUP]).await
}

/// `runlock ARGS...` as `uid`, a member of the socket group.
async fn runlock_as(agent: &TestAgent, uid: u32, args: &[&str]) -> Result<Finished> {
    let mut command = setpriv(uid, uid, &[RUNLOCK_GROUP]);
    command
        .arg(&crate::support::bins::bins()?.runlock)
        .arg("--socket")
        .arg(agent.socket())
        .args(args)
        .env_remove("RUNLOCK_SOCKET");
    Run::spawn(command)?.finish().await
}

/// The next message must be an error of `code` whose message holds `text`.
async fn expect_error(client: &mut RawClient, code: ErrorCode, text: &str) -> Result<WireError> {
    match client.recv().await?.body {
        AgentMessage::Error(err) if err.code == code && err.message.contains(text) => Ok(err),
        other => bail!("expected {code:?} saying {text:?}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_at_its_connection_cap_neither_unlocks_nor_starves_anothers_run() -> Result<()> {
    let agent = limited_agent().await?;
    let k = key("starved");
    let (holder, _) = agent.hold(&k).await?;
    let mut idle = Vec::new();
    for _ in 0..8 {
        let mut client = member(&agent).await?;
        client.hello().await?;
        idle.push(client);
    }
    // The ninth is told the agent is busy, and why, before it says a word.
    let mut ninth = member(&agent).await?;
    let busy = expect_error(&mut ninth, ErrorCode::Unavailable, "agent busy").await?;
    ensure!(
        busy.message.contains("uid 65534") && busy.message.contains("connections_per_user"),
        "{busy:?}"
    );
    ninth.expect_closed().await?;
    // Root's second run of a held key is refused as held, never run unlocked.
    let out = agent.run(&[&k], &[], "echo second copy")?.finish().await?;
    out.expect_code(75)?;
    ensure!(!out.stdout.contains("second copy"), "{out:?}");
    // Another member is not starved by nobody's connections either.
    let other = runlock_as(
        &agent,
        OTHER,
        &["run", "--key", &key("other"), "--", "true"],
    )
    .await?;
    other.expect_code(0)?;
    agent.still_serves().await?;
    // Places come back as connections close.
    drop(idle);
    let deadline = crate::support::Deadline::new(crate::support::WAIT, "a freed place");
    loop {
        let mut again = member(&agent).await?;
        if again.hello().await.is_ok() {
            break;
        }
        deadline.tick().await?;
    }
    holder.end_and_expect_success().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_unfinished_connections_are_closed_after_the_handshake_timeout() -> Result<()> {
    let agent = limited_agent().await?;
    let mut silent = member(&agent).await?;
    expect_error(&mut silent, ErrorCode::BadRequest, "no hello within 1s").await?;
    silent.expect_closed().await?;

    // Half a hello, then nothing.
    let mut half = member(&agent).await?;
    let whole = frame(&encode(&Envelope::event(hello()))?);
    half.write_raw(&whole[..whole.len() / 2]).await?;
    expect_error(&mut half, ErrorCode::BadRequest, "no hello within 1s").await?;
    half.expect_closed().await?;

    // After hello: a frame announced at 1 MiB, 64 KiB of it sent, then nothing.
    let mut partial = member(&agent).await?;
    partial.hello().await?;
    let mut bytes = (runlock_protocol::MAX_FRAME_LEN as u32)
        .to_be_bytes()
        .to_vec();
    bytes.extend(std::iter::repeat_n(0x90u8, 64 * 1024));
    partial.write_raw(&bytes).await?;
    expect_error(
        &mut partial,
        ErrorCode::BadRequest,
        "not finished within 1s",
    )
    .await?;
    partial.expect_closed().await?;
    agent.still_serves().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_frame_before_hello_is_refused_at_its_header() -> Result<()> {
    let agent = limited_agent().await?;
    let mut client = member(&agent).await?;
    // Only the header: the agent must not wait for (or allocate) the body.
    client
        .write_raw(&(runlock_protocol::MAX_FRAME_LEN as u32).to_be_bytes())
        .await?;
    expect_error(&mut client, ErrorCode::BadRequest, "before hello").await?;
    client.expect_closed().await?;
    agent.still_serves().await
}

/// A map body written by hand: `fields` as MessagePack bytes, keys included.
fn map(fields: &[&[u8]], pairs: u8) -> Vec<u8> {
    let mut body = vec![0x80 | pairs];
    for field in fields {
        body.extend_from_slice(field);
    }
    body
}

const TYPE: &[u8] = &[0xa4, b't', b'y', b'p', b'e'];
const ID_7: &[u8] = &[0xa2, b'i', b'd', 0x07];
const PING: &[u8] = &[0xa4, b'p', b'i', b'n', b'g'];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_are_decoded_as_spec_says_not_leniently() -> Result<()> {
    let agent = limited_agent().await?;
    // `{type: 0}` is not hello (serde would take it as the first variant).
    let mut client = member(&agent).await?;
    client.write_raw(&frame(&map(&[TYPE, &[0x00]], 1))).await?;
    expect_error(&mut client, ErrorCode::BadRequest, "`type` is not a string").await?;
    client.expect_closed().await?;

    let mut client = member(&agent).await?;
    client.hello().await?;
    let bin_ping: &[u8] = &[0xc4, 4, b'p', b'i', b'n', b'g'];
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (map(&[ID_7, TYPE, &[0x01]], 2), "`type` is not a string"),
        (map(&[ID_7, TYPE, bin_ping], 2), "bin"),
        ([map(&[ID_7, TYPE, PING], 2), vec![0xc0]].concat(), "follow"),
        (map(&[ID_7, TYPE, PING, &[0x01, 0x02]], 3), "not a string"),
        (map(&[ID_7, TYPE, PING, TYPE, PING], 3), "twice"),
    ];
    for (body, why) in cases {
        client.write_raw(&frame(&body)).await?;
        expect_error(&mut client, ErrorCode::BadRequest, why)
            .await
            .with_context(|| format!("body {body:02x?}"))?;
    }
    // The connection stays usable after each.
    ensure!(
        matches!(client.call(ClientMessage::Ping).await?, AgentMessage::Pong),
        "no pong"
    );
    agent.still_serves().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_command_line_shows_only_its_program() -> Result<()> {
    let agent = limited_agent().await?;
    let k = key("private");
    let secret = "--password=hunter2";
    let script = format!("{HOLD} # {secret}");
    let mut held = as_nobody(
        &agent,
        &[RUNLOCK_GROUP],
        &["run", "--key", &k, "--", "sh", "-c", &script],
    )?;
    held.ready().await?;
    let outsiders = [
        runlock_as(&agent, OTHER, &["status"]).await?,
        runlock_as(&agent, OTHER, &["status", "--json"]).await?,
        runlock_as(&agent, OTHER, &["inspect", &k]).await?,
        runlock_as(&agent, OTHER, &["run", "--key", &k, "--", "true"]).await?,
        runlock_as(&agent, OTHER, &["list", "--json"]).await?,
    ];
    for out in &outsiders {
        ensure!(
            !out.stdout.contains("hunter2") && !out.stderr.contains("hunter2"),
            "{out:?}"
        );
        ensure!(
            out.stdout.contains("sh [arguments hidden]")
                || out.stderr.contains("sh [arguments hidden]"),
            "{out:?}"
        );
    }
    outsiders[3].expect_code(75)?;
    // Its owner sees all of it, and so does root (who may force).
    let own = runlock_as(&agent, NOBODY, &["status"]).await?;
    ensure!(own.stdout.contains("hunter2"), "{own:?}");
    let own = runlock_as(&agent, NOBODY, &["list", "--json"]).await?;
    ensure!(own.stdout.contains("hunter2"), "{own:?}");
    let root = agent.runlock_output(&["inspect", &k]).await?;
    ensure!(root.stdout.contains("hunter2"), "{root:?}");
    held.end_and_expect_success().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slot_counts_and_slot_numbers_out_of_range_are_refused_and_take_nothing() -> Result<()> {
    let agent = limited_agent().await?;
    let mut client = member(&agent).await?;
    client.hello().await?;
    let k = key("slots-bounds");
    // Every slot is a store read when the key is contended: the count is bounded.
    for slots in [0, runlock_protocol::MAX_SLOTS + 1, u32::MAX] {
        let mut request = acquire(&[&k]);
        if let ClientMessage::Acquire(req) = &mut request {
            req.slots = slots;
        }
        match client.call(request).await? {
            AgentMessage::Error(err) if err.code == ErrorCode::BadRequest => {
                ensure!(
                    err.message.contains("slots must be between 1 and 64"),
                    "{err:?}"
                )
            }
            other => bail!("slots {slots}: expected bad_request, got {other:?}"),
        }
    }
    ensure!(!client.is_held(&k).await?, "a refused request took the key");
    // Breaking a slot no key can have (and nobody may break anyway).
    let breaking = ClientMessage::Release(ReleaseRequest {
        lease_ids: Vec::new(),
        key: Some(k.clone()),
        slot: Some(runlock_protocol::MAX_SLOTS),
    });
    match client.call(breaking).await? {
        AgentMessage::Error(err) if err.code == ErrorCode::BadRequest => {}
        other => bail!("expected bad_request, got {other:?}"),
    }
    agent.still_serves().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_fields_get_their_own_errors_and_every_reply_fits() -> Result<()> {
    let agent = limited_agent().await?;
    let mut client = member(&agent).await?;
    client.hello().await?;

    // More keys than a reply can list: refused, and none of them taken.
    let many: Vec<String> = (0..1001).map(|i| key(&format!("many-{i}"))).collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    match client.call(acquire(&refs)).await? {
        AgentMessage::Error(err) if err.code == ErrorCode::BadRequest => {
            ensure!(err.message.contains("at most 1000"), "{err:?}")
        }
        other => bail!("expected bad_request, got {other:?}"),
    }
    ensure!(!client.is_held(&many[0]).await?, "a key was left taken");

    // A key of almost a megabyte is an invalid key, echoed cut.
    let huge_key = "k".repeat(runlock_protocol::MAX_FRAME_LEN - 200);
    match client.call(acquire(&[&huge_key])).await? {
        AgentMessage::Error(err) if err.code == ErrorCode::InvalidKey => {
            ensure!(
                err.key.as_ref().is_some_and(|k| k.len() <= 512),
                "{:?}",
                err.key.map(|k| k.len())
            )
        }
        other => bail!("expected invalid_key, got {other:?}"),
    }

    // A holder whose command is almost a megabyte is recorded cut, so every
    // contender's reply (and `inspect`) still fits a frame.
    let k = key("long-command");
    let mut request = acquire(&[&k]);
    if let ClientMessage::Acquire(req) = &mut request {
        req.command = "x".repeat(runlock_protocol::MAX_FRAME_LEN - 300);
    }
    ensure!(
        matches!(client.call(request).await?, AgentMessage::Acquired { .. }),
        "not granted"
    );
    let contender = agent.run(&[&k], &[], "echo ran")?.finish().await?;
    contender.expect_code(75)?;
    let record = agent.inspect_json(&k).await?;
    let command = record["holder"]["command"].as_str().context("no command")?;
    ensure!(
        command.len() <= runlock_protocol::MAX_COMMAND_LEN,
        "{} bytes",
        command.len()
    );
    ensure!(command.ends_with("[cut]"), "no cut marker");
    agent.still_serves().await
}

/// Descriptors open in process `pid`.
fn open_descriptors(pid: u32) -> Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_a_peer_sends_are_never_kept() -> Result<()> {
    let agent = agent("").await?;
    let pid = agent.pid().context("agent pid")?;
    let mut client = member(&agent).await?;
    client.hello().await?;
    let before = open_descriptors(pid)?;
    // 100 pings, each carrying 200 descriptors: 20,000 in all, were they kept.
    let null = std::fs::File::open("/dev/null")?;
    let fds = vec![std::os::fd::AsRawFd::as_raw_fd(&null); 200];
    for id in 0..100 {
        let ping = frame(&encode(&Envelope::request(id, ClientMessage::Ping))?);
        client.write_with_fds(&ping, &fds).await?;
    }
    for _ in 0..100 {
        ensure!(
            matches!(client.recv().await?.body, AgentMessage::Pong),
            "not a pong"
        );
    }
    let after = open_descriptors(pid)?;
    ensure!(
        after <= before + 2,
        "{before} descriptors before, {after} after"
    );
    agent.still_serves().await
}

/// Issue 27, attack 4, on an object store: a member's runs hold every slot
/// of a 32-slot key and 32 more wait for one, each try reading the key's
/// slot records through the store client that root's renewals share.
/// Root's run with a short TTL keeps renewing (it is never lost for want
/// of a renewal) and root's other runs are served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_members_slot_waiters_on_s3_neither_stop_nor_starve_roots_runs() -> Result<()> {
    use crate::support::stores::{Space, S3};
    use std::os::unix::fs::PermissionsExt;
    const SLOTS: &str = "32";
    let space = Space::create(S3, "slot-flood").await?;
    let group = RUNLOCK_GROUP.to_string();
    let agent = space.agent("p", &["--socket-group", &group]).await?;
    std::fs::set_permissions(agent.dir(), std::fs::Permissions::from_mode(0o755))?;
    let w = key("slot-flood");
    let hold = ["run", "--slots", SLOTS, "--key", &w, "--", "sh", "-c", HOLD];
    // One at a time: started together, the member's 32 acquisitions take
    // turns (a user's slot takes are one at a time), each reading the key's
    // 32 slot records, and on a loaded machine the last ones outwaited the
    // shim's 15 s for an answer. The waiters below are the flood this test
    // is about.
    let mut holders = Vec::new();
    for _ in 0..32 {
        let mut holder = as_nobody(&agent, &[RUNLOCK_GROUP], &hold)?;
        holder.ready().await?;
        holders.push(holder);
    }
    let wait = [
        "run", "--slots", SLOTS, "--wait", "60s", "--key", &w, "--", "true",
    ];
    let mut waiters = Vec::new();
    for _ in 0..32 {
        waiters.push(as_nobody(&agent, &[RUNLOCK_GROUP], &wait)?);
    }
    // Root's lease is renewed every 2 s (TTL 6 s) through the same client
    // while the waiters poll; a renewal starved past its deadline ends it 76.
    let roots = agent.run(&[&key("roots")], &["--ttl", "6s"], "sleep 12; echo done")?;
    for n in 0..5 {
        let short = agent.run(&[&key(&format!("roots-{n}"))], &[], "echo served")?;
        let short = short.finish().await?;
        short.expect_output("served\n")?;
    }
    let roots = roots
        .finish_within(std::time::Duration::from_secs(45))
        .await?;
    roots.expect_output("done\n")?;
    for waiter in &waiters {
        waiter.signal(nix::sys::signal::Signal::SIGKILL)?;
    }
    for holder in holders {
        holder.end_and_expect_success().await?;
    }
    Ok(())
}
