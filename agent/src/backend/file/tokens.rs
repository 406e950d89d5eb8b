//! A key's `KEY.tokens`: the highest token ever reserved for it, kept apart
//! from its record and only ever raised, durably, as each block is
//! reserved. A record removed, moved aside or lost to a power cut (a record
//! is written without a sync) then costs no token: the next starts above
//! every token the key handed out.

use super::*;
use record::next_token;

impl Inner {
    /// The token for a grant of `key` after `previous` (its record, if it
    /// has one) and the block it falls in, that block kept first when new.
    pub(super) fn token_block(
        &self,
        dir: &File,
        key: &Key,
        previous: Option<&FileRecord>,
    ) -> BackendResult<(u64, u64)> {
        let (token, reserved, reserving) = next_token(previous, 0, &self.boot_id);
        if !reserving {
            return Ok((token, reserved));
        }
        let name = tokens_name(key);
        let kept = self.kept_tokens(dir, &name)?;
        let (token, reserved, _) = next_token(previous, kept, &self.boot_id);
        let bytes = format!("{reserved}\n");
        off_worker(|| replace::replace(dir, &name, bytes.as_bytes(), true))
            .map_err(|e| self.io_error("writing", &name, e))?;
        Ok((token, reserved))
    }

    /// The highest token reserved as `name` keeps it; 0 when none was kept.
    pub(super) fn kept_tokens(&self, dir: &File, name: &str) -> BackendResult<u64> {
        let Some(file) = self.try_open(dir, name, OFlag::O_RDONLY)? else {
            return Ok(0);
        };
        let bytes = read_bytes(&file).map_err(|e| self.io_error("reading", name, e))?;
        let text = String::from_utf8_lossy(&bytes);
        text.trim().parse().map_err(|_| {
            BackendError::Corrupt(format!(
                "{} does not hold the highest token the key handed out ({:?}); \
                 runlock reads it to hand out none of them again, so it cannot \
                 grant the key until it holds a number at least that high",
                self.path(name).display(),
                text.chars().take(40).collect::<String>()
            ))
        })
    }
}
