"""Curation inside `dlx prepare`: per-document filters (language, quality, decontamination), PII redaction, and the
signatures that exact and near-duplicate removal decide on, over the whole corpus, after every unit is read.

`spec` holds what was asked (validated, recorded in the manifest); `stages.Curator` runs the per-document stages in a
worker; `dedup` decides, from the signatures alone and in corpus order, which documents are duplicates; `report`
writes what each stage removed, per source and per reason.
"""
