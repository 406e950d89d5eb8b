//! Meltano: `runlock run --meltano`, `runlockd check-config --from-meltano`,
//! the guard on Meltano's system database, the differential test against
//! Meltano itself, and runs of the real Meltano end to end.

mod differential;
mod e2e;
mod from_meltano;
mod legacy;
mod run;
