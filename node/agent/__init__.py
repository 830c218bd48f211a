"""The node agent: keeps a compute node's registration on the committee chain alive."""
