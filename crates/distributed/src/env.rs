//! Who am I in the job: rank, world size, local rank and the rendezvous address, from whichever launcher started
//! this process. Supported (first match wins):
//!
//! | launcher | variables read |
//! | --- | --- |
//! | torchrun, `rn50 launch`, or by hand | RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT |
//! | Open MPI `mpirun` | OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE |
//! | SLURM `srun` | SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE (`4(x2),3`) / SLURM_NTASKS_PER_NODE, SLURM_STEP_NODELIST / SLURM_JOB_NODELIST / SLURM_NODELIST, SLURM_JOB_ID |
//! | MPICH/Intel MPI (Hydra), Cray PALS (PBS Pro `mpiexec`) | PMI_RANK/PMI_SIZE or PALS_RANKID/PALS_SIZE, PMI_LOCAL_RANK/MPI_LOCALRANKID/PALS_LOCAL_RANKID, PMI_LOCAL_SIZE/MPI_LOCALNRANKS/PALS_LOCAL_SIZE |
//! | none | a single process |
//!
//! The master address is MASTER_ADDR when set; otherwise the first host of the SLURM node list, or the first line
//! of PBS_NODEFILE (PBS/UGE), or 127.0.0.1 when every rank is on this node. The port is MASTER_PORT, else one
//! derived from the job so that jobs sharing a node do not collide (Open MPI's own job: OMPI_MCA_ess_base_jobid or
//! PMIX_NAMESPACE; else the scheduler's: SLURM_JOB_ID, PBS_JOBID, JOB_ID), else 29500.
//! A SLURM batch script itself (no SLURM_STEP_ID: not started by srun) is a single process.
use crate::nodelist;
use std::collections::HashMap;
use std::path::Path;
use thiserror::Error;

/// Which launcher the world information came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchSource {
    Single,
    /// torchrun, `rn50 launch` or variables set by hand.
    Torchrun,
    Slurm,
    OpenMpi,
    /// PMI-style variables: MPICH/Intel MPI Hydra, Cray PALS (PBS Pro).
    Pmi,
}

impl LaunchSource {
    /// What `rn50 doctor` calls it.
    pub fn name(self) -> &'static str {
        match self {
            LaunchSource::Single => "none (single process)",
            LaunchSource::Torchrun => "torchrun",
            LaunchSource::Slurm => "SLURM",
            LaunchSource::OpenMpi => "Open MPI",
            LaunchSource::Pmi => "PMI (MPICH/Intel MPI/PALS)",
        }
    }
}

/// This process's place in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorldInfo {
    pub rank: usize,
    pub world_size: usize,
    /// Rank among the processes on this node (→ GPU index).
    pub local_rank: usize,
    pub local_world_size: usize,
    pub master_addr: String,
    pub master_port: u16,
    pub source: LaunchSource,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EnvError {
    #[error("{var}={value:?} is not a valid {what}")]
    Invalid {
        var: String,
        value: String,
        what: &'static str,
    },
    #[error("{0}")]
    Inconsistent(String),
    #[error(transparent)]
    Parse(#[from] nodelist::ParseError),
}

pub const DEFAULT_PORT: u16 = 29500;

struct Vars<'a>(&'a HashMap<String, String>);

impl Vars<'_> {
    fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(|s| s.trim()).filter(|s| !s.is_empty())
    }

    fn first<'k>(&self, ks: &[&'k str]) -> Option<(&'k str, String)> {
        ks.iter()
            .find_map(|&k| self.get(k).map(|v| (k, v.to_string())))
    }

    fn num(&self, ks: &[&str]) -> Result<Option<usize>, EnvError> {
        match self.first(ks) {
            None => Ok(None),
            Some((k, v)) => v.parse().map(Some).map_err(|_| EnvError::Invalid {
                var: k.into(),
                value: v,
                what: "non-negative integer",
            }),
        }
    }

    fn has(&self, k: &str) -> bool {
        self.get(k).is_some()
    }
}

impl WorldInfo {
    /// A single process, no rendezvous.
    pub fn single() -> WorldInfo {
        WorldInfo {
            rank: 0,
            world_size: 1,
            local_rank: 0,
            local_world_size: 1,
            master_addr: "127.0.0.1".into(),
            master_port: DEFAULT_PORT,
            source: LaunchSource::Single,
        }
    }

    /// From the process environment.
    pub fn from_env() -> Result<WorldInfo, EnvError> {
        let vars: HashMap<String, String> = std::env::vars().collect();
        WorldInfo::from_vars(&vars)
    }

    /// From a map of environment variables (see the module docs for what is read). PBS_NODEFILE, when used, is
    /// read from disk.
    pub fn from_vars(env: &HashMap<String, String>) -> Result<WorldInfo, EnvError> {
        let v = Vars(env);
        let (source, rank, world, local_rank, local_world) = if v.has("RANK") && v.has("WORLD_SIZE")
        {
            let (r, w) = (
                v.num(&["RANK"])?.unwrap_or(0),
                v.num(&["WORLD_SIZE"])?.unwrap_or(1),
            );
            // Without the local variables assume one node (set them for multi-node jobs).
            let lw = v.num(&["LOCAL_WORLD_SIZE"])?.unwrap_or(w);
            let lr = v.num(&["LOCAL_RANK"])?.unwrap_or(r % lw.max(1));
            (LaunchSource::Torchrun, r, w, lr, lw)
        } else if v.has("OMPI_COMM_WORLD_RANK") {
            (
                LaunchSource::OpenMpi,
                v.num(&["OMPI_COMM_WORLD_RANK"])?.unwrap_or(0),
                v.num(&["OMPI_COMM_WORLD_SIZE"])?.unwrap_or(1),
                v.num(&["OMPI_COMM_WORLD_LOCAL_RANK"])?.unwrap_or(0),
                v.num(&["OMPI_COMM_WORLD_LOCAL_SIZE"])?.unwrap_or(1),
            )
        } else if v.has("SLURM_PROCID") && (v.has("SLURM_STEP_ID") || v.has("SLURM_STEPID")) {
            let rank = v.num(&["SLURM_PROCID"])?.unwrap_or(0);
            let world = v
                .num(&["SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"])?
                .unwrap_or(1);
            let local_rank = v.num(&["SLURM_LOCALID"])?.unwrap_or(0);
            let node = v.num(&["SLURM_NODEID"])?.unwrap_or(0);
            let local_world = match v.first(&["SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"])
            {
                Some((_, s)) => {
                    let per = nodelist::expand_tasks_per_node(&s)?;
                    *per.get(node).ok_or_else(|| {
                        EnvError::Inconsistent(format!(
                            "SLURM_NODEID={node} but tasks per node {s:?} lists {} nodes",
                            per.len()
                        ))
                    })?
                }
                None => v.num(&["SLURM_NTASKS_PER_NODE"])?.unwrap_or(1),
            };
            (LaunchSource::Slurm, rank, world, local_rank, local_world)
        } else if v.has("PMI_RANK") || v.has("PALS_RANKID") {
            (
                LaunchSource::Pmi,
                v.num(&["PMI_RANK", "PALS_RANKID"])?.unwrap_or(0),
                v.num(&["PMI_SIZE", "PALS_SIZE", "WORLD_SIZE"])?
                    .unwrap_or(1),
                v.num(&["PMI_LOCAL_RANK", "MPI_LOCALRANKID", "PALS_LOCAL_RANKID"])?
                    .unwrap_or(0),
                v.num(&["PMI_LOCAL_SIZE", "MPI_LOCALNRANKS", "PALS_LOCAL_SIZE"])?
                    .unwrap_or(1),
            )
        } else {
            let mut w = WorldInfo::single();
            if let Some((_, p)) = v.first(&["MASTER_PORT"]) {
                w.master_port = port(&p)?;
            }
            return Ok(w);
        };

        if world == 0 || rank >= world {
            return Err(EnvError::Inconsistent(format!(
                "{source:?}: rank {rank} is outside a world of {world}"
            )));
        }
        if local_world == 0 || local_rank >= local_world || local_world > world {
            return Err(EnvError::Inconsistent(format!(
                "{source:?}: local rank {local_rank} of {local_world} processes on this node (world {world})"
            )));
        }
        let master_addr = match v.get("MASTER_ADDR") {
            Some(a) => a.to_string(),
            None => default_master(&v, source, world, local_world)?,
        };
        let master_port = match v.get("MASTER_PORT") {
            Some(p) => port(p)?,
            None => default_port(&v, source),
        };
        Ok(WorldInfo {
            rank,
            world_size: world,
            local_rank,
            local_world_size: local_world,
            master_addr,
            master_port,
            source,
        })
    }

    pub fn is_distributed(&self) -> bool {
        self.world_size > 1
    }

    /// Only rank 0 logs, writes checkpoints and reports.
    pub fn is_main(&self) -> bool {
        self.rank == 0
    }

    /// CPU threads for this process: the CPUs available to it split evenly between the ranks on this node.
    pub fn threads_per_rank(&self) -> usize {
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        threads_per_local_rank(cpus, self.local_world_size)
    }
}

/// `cpus` split between `local_world` processes, at least 1 each.
pub fn threads_per_local_rank(cpus: usize, local_world: usize) -> usize {
    (cpus / local_world.max(1)).max(1)
}

fn port(s: &str) -> Result<u16, EnvError> {
    s.parse::<u16>()
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| EnvError::Invalid {
            var: "MASTER_PORT".into(),
            value: s.into(),
            what: "TCP port",
        })
}

/// 15000-29999 from the job, so that jobs sharing a node do not collide: Open MPI's own job (every `mpirun` is
/// one, even inside a scheduler's allocation: `OMPI_MCA_ess_base_jobid`, or `PMIX_NAMESPACE`, the same on every
/// node of the job) hashed into the range; else the scheduler's numeric job id (SLURM_JOB_ID, PBS_JOBID, JOB_ID)
/// as 15000 + id mod 15000 (what scripts/slurm-train.sbatch computes); else [`DEFAULT_PORT`].
fn default_port(v: &Vars, source: LaunchSource) -> u16 {
    if source == LaunchSource::OpenMpi {
        if let Some((_, job)) = v.first(&["OMPI_MCA_ess_base_jobid", "PMIX_NAMESPACE"]) {
            return port_of_name(&job);
        }
    }
    let id = v
        .first(&["SLURM_JOB_ID", "SLURM_JOBID", "PBS_JOBID", "JOB_ID"])
        .and_then(|(_, id)| {
            id.split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|d| d.parse::<u64>().ok())
        });
    match id {
        Some(id) => 15000 + (id % 15000) as u16,
        None => DEFAULT_PORT,
    }
}

/// 15000-29999 from a job name (FNV-1a, stable across builds and hosts). Open MPI 4's numeric job ids are the
/// job family in the high 16 bits and a counter in the low ones, so `id mod 15000` would use an eighth of the
/// range; hashing the text spreads them, and covers Open MPI 5's `prterun-HOST-PID@1` namespaces too.
fn port_of_name(job: &str) -> u16 {
    let h = job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    15000 + (h % 15000) as u16
}

fn default_master(
    v: &Vars,
    source: LaunchSource,
    world: usize,
    local_world: usize,
) -> Result<String, EnvError> {
    if let Some((_, list)) = v.first(&[
        "SLURM_STEP_NODELIST",
        "SLURM_JOB_NODELIST",
        "SLURM_NODELIST",
    ]) {
        return Ok(nodelist::first_host(&list)?);
    }
    if let Some(file) = v.get("PBS_NODEFILE") {
        let text = std::fs::read_to_string(Path::new(file)).map_err(|e| {
            EnvError::Inconsistent(format!(
                "PBS_NODEFILE={file} cannot be read ({e}); set MASTER_ADDR"
            ))
        })?;
        return text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty())
            .map(str::to_string)
            .ok_or_else(|| {
                EnvError::Inconsistent(format!("PBS_NODEFILE={file} is empty; set MASTER_ADDR"))
            });
    }
    if world == local_world {
        return Ok("127.0.0.1".into());
    }
    let how = match source {
        LaunchSource::OpenMpi => "; pass rank 0's host: mpirun -x MASTER_ADDR=<first host> …",
        LaunchSource::Pmi => "; pass rank 0's host: mpiexec -genv MASTER_ADDR <first host> …",
        _ => "; set MASTER_ADDR to rank 0's host",
    };
    Err(EnvError::Inconsistent(format!(
        "{}: {world} ranks over several nodes but no MASTER_ADDR, SLURM node list or PBS_NODEFILE{how}",
        source.name()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Two `mpirun` jobs on one node (job ids as Open MPI 4.1 gave them here) get different ports in
    /// 15000-29999, the same on every rank of a job; a SLURM or PBS job id still gives 15000 + id mod 15000.
    #[test]
    fn default_port_comes_from_the_job() {
        let port = |kv: &[(&str, &str)], source| default_port(&Vars(&vars(kv)), source);
        let a = port(
            &[("OMPI_MCA_ess_base_jobid", "1264517121")],
            LaunchSource::OpenMpi,
        );
        let b = port(
            &[("OMPI_MCA_ess_base_jobid", "1263271937")],
            LaunchSource::OpenMpi,
        );
        assert_ne!(a, b);
        assert_ne!(a, DEFAULT_PORT);
        assert_eq!(a, port_of_name("1264517121"));
        assert_eq!(
            port(&[("PMIX_NAMESPACE", "1264517121")], LaunchSource::OpenMpi),
            a
        );
        // Open MPI's own job wins over the allocation it runs in (two mpiruns in one PBS job).
        assert_eq!(
            port(
                &[
                    ("OMPI_MCA_ess_base_jobid", "1264517121"),
                    ("PBS_JOBID", "42.pbs")
                ],
                LaunchSource::OpenMpi
            ),
            a
        );
        assert_eq!(
            port(&[("PBS_JOBID", "42.pbs")], LaunchSource::OpenMpi),
            15042
        );
        assert_eq!(port(&[], LaunchSource::OpenMpi), DEFAULT_PORT);
        // Not Open MPI: its variables (inherited from an outer mpirun) are not this job's.
        assert_eq!(
            port(
                &[
                    ("OMPI_MCA_ess_base_jobid", "1264517121"),
                    ("SLURM_JOB_ID", "123456")
                ],
                LaunchSource::Slurm
            ),
            15000 + (123456 % 15000) as u16
        );
        // Open MPI 4's job ids are a family (high 16 bits) and a counter: `id mod 15000` would give the 65536
        // families only 1875 ports; hashed they spread over nearly all 15000.
        let ports: std::collections::HashSet<u16> = (0..1u64 << 16)
            .map(|fam| port_of_name(&((fam << 16) | 1).to_string()))
            .collect();
        assert!(ports.len() > 14000, "{}", ports.len());
        assert!(ports.iter().all(|p| (15000..30000).contains(p)));
        // Open MPI 5 (PRRTE) namespaces are text.
        let p5 = port(
            &[("PMIX_NAMESPACE", "prterun-vm-4242@1")],
            LaunchSource::OpenMpi,
        );
        assert!((15000..30000).contains(&p5));
    }
}
