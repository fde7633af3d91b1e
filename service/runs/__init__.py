"""Training runs: one per (project, name); a restarted job resumes its run."""
