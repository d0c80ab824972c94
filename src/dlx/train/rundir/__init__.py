"""The run folder, local or in a bucket: `checkpoint` (write, verify, load, prune, rewind), `checkpoint_record`
(trainer_state.json: each file's size and SHA-256), `folder` (what a run folder holds, its saved config), `runlock`
(one writer), `remote` (a run folder in a bucket: upload, pull), `trained` (finding trained weights anywhere)."""
