"""The round: plan each row's gamma, propose, verify, accept; drafting ahead, timing and output."""
