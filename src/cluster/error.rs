//! Why a job's ranks could not start or exchange.

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "this process is one of {size} started by an MPI launcher ({variable} is set), but this throng \
         was built without MPI, so the {size} copies would each run the whole job and overwrite one \
         another's run folder: rebuild with `cargo build --release --features mpi` (Open MPI: \
         `apt-get install libopenmpi-dev openmpi-bin`), or start a single process without mpirun"
    )]
    NotBuiltWithMpi { size: usize, variable: &'static str },
    #[error(
        "srun started {size} tasks, but they are not connected through MPI{why}: start them with \
         `srun --mpi=pmix throng ...` (see `srun --mpi=list`) and a throng built with `--features mpi`"
    )]
    NotConnected { size: usize, why: &'static str },
    #[error(
        "rank {rank} sent nothing for {secs} s while {during}: it died or hangs; stopping the job \
             (if its steps are really that uneven, raise --rank-timeout)"
    )]
    Timeout {
        rank: usize,
        secs: u64,
        during: &'static str,
    },
    #[error("a message of {bytes} bytes is over MPI's limit of 2 GiB per message")]
    TooLarge { bytes: usize },
    #[error("{0}")]
    Mpi(String),
}
