"""DraftModel (decoding/draft_model.py): the protocol decoding recognises a DSpark assistant by. A DSparkDrafter is
one; a plain transformers model is not; nor is the bare network, DSparkDraftModel, which has no options."""

from hf_dspark import DSparkDrafter
from hf_dspark.decoding.draft_model import DraftModel
from hf_dspark.model.drafter import DSparkDraftModel
from tests.conftest import tiny_target


def test_a_dspark_drafter_is_a_draft_model_and_nothing_else_is():
    model = tiny_target()
    assert not isinstance(model, DraftModel)  # a plain transformers model
    drafter = DSparkDrafter.from_target(model, block_size=3, target_layer_ids=[0, 2])
    assert isinstance(drafter, DraftModel)
    assert not isinstance(model, DraftModel)  # still not, once enabled
    net = DSparkDraftModel.from_target(tiny_target(), block_size=3, target_layer_ids=[0, 2])
    assert not isinstance(net, DraftModel)  # the network alone: no options, no last_stats
    net.options, net.last_stats = drafter.options, None
    assert isinstance(net, DraftModel)  # structural: what it lacked is all the protocol asks beyond the network
