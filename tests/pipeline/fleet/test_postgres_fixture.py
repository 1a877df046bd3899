"""The throwaway PostgreSQL cluster that the central-record tests build on."""
from __future__ import annotations

import pytest


def test_cluster_stores_and_returns_rows(postgres) -> None:
    postgres.psql("CREATE TABLE fixture_runs (host text NOT NULL, run_id text PRIMARY KEY)")
    postgres.psql("INSERT INTO fixture_runs VALUES ('hosta', 'r1'), ('hostb', 'r2')")
    assert postgres.psql("SELECT host || ':' || run_id FROM fixture_runs ORDER BY run_id") == "hosta:r1\nhostb:r2"
    with pytest.raises(RuntimeError, match="duplicate key"):
        postgres.psql("INSERT INTO fixture_runs VALUES ('hostc', 'r1')")


def test_cluster_is_reachable_by_its_socket_only(postgres) -> None:
    assert postgres.psql("SHOW listen_addresses") == ""
    assert postgres.psql("SHOW unix_socket_directories") == str(postgres.socket_dir)


def test_cluster_is_gone_after_stop(postgres_binaries) -> None:
    from tests.pipeline.fleet.pgcluster import PostgresCluster

    cluster = PostgresCluster(postgres_binaries).start()
    directory = cluster.dir
    assert (directory / "data" / "postmaster.pid").exists()
    cluster.stop()
    assert not directory.exists()
    with pytest.raises(RuntimeError):
        cluster.psql("SELECT 1")
