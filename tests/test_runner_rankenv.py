"""Unit tests: rank, size and local rank from each launcher's variables."""

from hvdlite.runner.rankenv import RankEnv, from_environ


def test_nothing_set():
    assert from_environ({}) is None


def test_open_mpi():
    env = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "PMIX_RANK": "3",
        "SLURM_PROCID": "0",
    }
    assert from_environ(env) == RankEnv(3, 4, 1, 2, "openmpi")


def test_hydra_mpiexec_inside_a_batch_script():
    # Under mpiexec in a batch job SLURM_PROCID is 0 on every rank: PMI wins.
    env = {
        "PMI_RANK": "1",
        "PMI_SIZE": "2",
        "MPI_LOCALRANKID": "1",
        "MPI_LOCALNRANKS": "2",
        "SLURM_JOB_ID": "7",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "2",
    }
    assert from_environ(env) == RankEnv(1, 2, 1, 2, "pmi")


def test_srun_pmi2():
    env = {
        "PMI_RANK": "5",
        "PMI_SIZE": "8",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "4(x2)",
    }
    assert from_environ(env) == RankEnv(5, 8, 1, 4, "pmi")


def test_srun_pmix():
    env = {
        "PMIX_RANK": "2",
        "SLURM_STEP_ID": "0",
        "SLURM_STEP_NUM_TASKS": "3",
        "SLURM_PROCID": "2",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "1",
        "SLURM_STEP_TASKS_PER_NODE": "2,1",
    }
    assert from_environ(env) == RankEnv(2, 3, 0, 1, "pmix")


def test_bare_srun_step_and_batch_script():
    step = {
        "SLURM_STEP_ID": "3",
        "SLURM_PROCID": "1",
        "SLURM_NTASKS": "2",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "0",
        "SLURM_STEP_TASKS_PER_NODE": "2",
    }
    assert from_environ(step) == RankEnv(1, 2, 1, 2, "slurm")
    batch = {"SLURM_JOB_ID": "3", "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}
    assert from_environ(batch) is None
