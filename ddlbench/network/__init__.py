"""The network model: alpha-beta costs of collectives on a multi-dimensional network from conf/network/
(model.py), and the fit of alpha and beta from measured collective times (fit.py). `bench project`
prices runs on it (ddlbench/project/)."""
