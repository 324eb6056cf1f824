"""qkv.hardware: threads per concurrent job — the cores divided among the jobs, never above a user's OMP_NUM_THREADS."""

from qkv.hardware import threads_per_job


def test_threads_per_job_keeps_the_users_omp_limit(monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert [threads_per_job(j) for j in (1, 2, 3, 4, 8)] == [4, 2, 1, 1, 1]
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert threads_per_job(1) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads_per_job(1) == 3 and threads_per_job(2) == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "nonsense")
    assert threads_per_job(1) == 4
