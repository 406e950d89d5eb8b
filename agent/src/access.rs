//! Who may force a lock or break a lease they do not hold: the uids and groups
//! the configuration lists, by default root and the agent's own user.

/// The rights to force and break.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Access {
    uids: Vec<u32>,
    gids: Vec<u32>,
}

impl Access {
    /// The listed users and groups; an unlisted side keeps its default
    /// (users: root and the agent's own; groups: none).
    pub fn new(uids: Option<Vec<u32>>, gids: Option<Vec<u32>>) -> Access {
        let agent = nix::unistd::geteuid().as_raw();
        let mut uids = uids.unwrap_or_else(|| vec![0, agent]);
        uids.sort_unstable();
        uids.dedup();
        let mut gids = gids.unwrap_or_default();
        gids.sort_unstable();
        gids.dedup();
        Access { uids, gids }
    }

    /// Whether a peer with this uid and these groups (primary included) may force and break.
    pub fn allows(&self, uid: u32, groups: &[u32]) -> bool {
        self.uids.contains(&uid) || groups.iter().any(|g| self.gids.contains(g))
    }

    /// The listed uids.
    pub fn uids(&self) -> &[u32] {
        &self.uids
    }

    /// The listed gids.
    pub fn gids(&self) -> &[u32] {
        &self.gids
    }

    /// Who may, for error messages.
    pub fn describe(&self) -> String {
        let mut who: Vec<String> = self.uids.iter().map(|u| format!("uid {u}")).collect();
        who.extend(self.gids.iter().map(|g| format!("group {g}")));
        if who.is_empty() {
            "nobody".to_string()
        } else {
            who.join(", ")
        }
    }
}

impl Default for Access {
    fn default() -> Access {
        Access::new(None, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_allow_root_and_the_agent_user_only() {
        let access = Access::default();
        let me = nix::unistd::geteuid().as_raw();
        assert!(access.allows(0, &[]));
        assert!(access.allows(me, &[]));
        assert!(!access.allows(4242, &[4242]) || me == 4242);
    }

    #[test]
    fn listed_groups_admit_their_members() {
        let access = Access::new(Some(vec![]), Some(vec![500]));
        assert!(!access.allows(0, &[0]));
        assert!(access.allows(1000, &[1000, 500]));
        assert_eq!(access.describe(), "group 500");
    }
}
