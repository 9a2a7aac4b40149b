"""Network model and projection (`bench project`): alpha-beta costs of the collectives a run
issued, on a multi-dimensional network from conf/network/, at any world size."""
