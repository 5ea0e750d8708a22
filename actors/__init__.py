"""Ray shell of specdec: the draft worker, the tensor-parallel target group and the router."""
