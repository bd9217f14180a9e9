"""The state derived from the log, one family per module, each with one owner (RocketMQ's
CommitLogDispatchers, which each build one index from the commit log and cut it back themselves):

  messages.py      queues and topics: the queue index, queue ends, what readers may see,
                   consumers' send-backs
  key_index.py     lookup by message key, written behind the log (as RocketMQ's IndexFile): its
                   records only queue their keys; `through` says how far it is written
  transactions.py  half messages pending or parked, and decisions (committed, rolled back)
  jobs.py          coordinated transactions: jobs by id and by name, their members
  offsets.py       consumer groups' committed offsets
  settings.py      producer groups' transaction settings
  marks.py         retention's marks: what a retention pass may delete up to, and what it must keep

Each owner (a Family) answers the same four questions, so "what happens to X when the log is
appended, expired or cut" has one place to read per X:
  apply    a record's effect, written into the open batch (store/state.py dispatches by record type);
  lineage  which records retention must keep because live state is derived from them (truncation
           derives that state again from the kept log, so it must still be there);
  forget   what goes with a record retention deletes (and `expire`: state that outlives its
           records, deleted by its own rule);
  cut      truncation: the effects of the records after the kept end undone, derived again from
           the kept log where they changed something.
"""
