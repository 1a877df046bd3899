"""The flash stage graph (pipeline/engine/flash_graph.py) is the one a flash runs through."""
from __future__ import annotations

from amdflash.pipeline.engine import flash_graph
from amdflash.stages.sim.synth import PART_KEY
from tests.pipeline.engine.conftest import flash_content


def test_the_graph_is_one_chain_of_small_bounded_queues() -> None:
    producers = [p for p, _, _ in flash_graph.GRAPH]
    consumers = [c for _, _, c in flash_graph.GRAPH]
    assert producers[1:] == consumers[:-1]                    # each stage feeds the next
    assert producers[0] == "backup" and consumers[-1] == "verify"
    names = [q.name for _, q, _ in flash_graph.GRAPH]
    assert len(set(names)) == len(names)
    assert all(1 <= q.size <= 16 and q.why for _, q, _ in flash_graph.GRAPH)


def test_a_flash_runs_through_the_graphs_queues(cli, make_board, image, db, monkeypatch) -> None:
    opened: list[tuple[str, float]] = []
    real_open = flash_graph.Queue.open

    def spy(queue: flash_graph.Queue) -> tuple:
        tx, rx = real_open(queue)
        opened.append((queue.name, tx.statistics().max_buffer_size))
        return tx, rx

    monkeypatch.setattr(flash_graph.Queue, "open", spy)
    board = make_board(content="blank", transport="ideal")
    assert cli("flash", image, "--yes", "--expect-part", PART_KEY, "--board", f"sim:{board}").code == 0
    assert flash_content(board) == image.read_bytes()
    assert opened == [(q.name, q.size) for _, q, _ in flash_graph.GRAPH]
