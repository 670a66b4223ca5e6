import pytest

from specdec.config import GenerationConfig
from specdec.verify import ancestor_matrix
from specdec.tree import TreeShape, parse_arms, parse_shape


def test_chain_and_tree_parsing():
    assert parse_shape("4") == TreeShape((1, 1, 1, 1))
    assert parse_shape("3,2,1") == TreeShape((3, 2, 1))
    assert parse_shape("(3, 2, 1)") == TreeShape((3, 2, 1))
    assert parse_shape(0).depth == 0
    assert parse_shape("4").name == "chain 4" and parse_shape("3,2").name == "(3,2)"


@pytest.mark.parametrize("bad", ["", "3,,2", "a", "3;2", "-1", "3,0,1", "(3,2", "1" * 5])
def test_malformed_shapes_are_refused(bad):
    with pytest.raises(ValueError):
        parse_shape(bad)


def test_layout_is_breadth_first():
    shape = TreeShape((2, 2))
    assert shape.level_sizes == [2, 4] and shape.num_drafted == 6
    assert shape.parents == [-1, 0, 0, 1, 1, 2, 2]
    assert shape.depths == [0, 1, 1, 2, 2, 2, 2]


def test_ancestor_matrix():
    anc = ancestor_matrix([-1, 0, 0, 1])
    assert anc[3].tolist() == [True, True, False, True]
    assert anc[2].tolist() == [True, False, True, False]


def test_arms():
    arms = parse_arms("4; 2,2,1 | 3,1,1")
    assert [a.name for a in arms] == ["chain 4", "(2,2,1)", "(3,1,1)"]
    with pytest.raises(ValueError):
        parse_arms("")
    assert [a.name for a in parse_arms("0; 3")] == ["none", "chain 3"]  # an arm that drafts nothing
    with pytest.raises(ValueError, match="differ"):
        parse_arms("3; 3")


def test_the_bandit_chooses_among_chains_under_sampling_unless_told_its_arms():
    def arms(**kwargs) -> list[str]:
        return [a.name for a in GenerationConfig(method="mamba-ucb", **kwargs).shapes()]

    assert arms() == ["none", "chain 3", "(2,1,1)", "(2,1,1,1)"]
    assert arms(temperature=0.7) == ["none", "chain 3", "chain 4"]
    assert arms(temperature=0.7, arms="0; 2,1") == ["none", "(2,1)"]


@pytest.mark.parametrize("kwargs, message", [
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"max_new_tokens": 10**6}, "max_new_tokens"),
    ({"method": "nope"}, "unknown method"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"reward": "x"}, "reward"),
    ({"method": "mamba-chain", "tree": "2,1"}, "chain"),
    ({"method": "lookup-chain", "tree": "2,2"}, "chain"),
    ({"method": "mamba-tree", "tree": "2,,1"}, "malformed"),
])
def test_bad_settings(kwargs, message):
    with pytest.raises(ValueError, match=message):
        GenerationConfig(**kwargs).validate()
