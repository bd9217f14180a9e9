"""The master's record of which slaves may hold what it acknowledged (broker/replication/slave_record.py):
what a restart's probation waits for. A slave is forgotten only once another holds all it was sent."""

from txbroker.broker.replication.slave_record import SlaveRecord


class State:
    """The store's side, as StateMachine has it (slave_record, keep_slave_record)."""

    def __init__(self, epoch=1):
        self.epoch = epoch
        self.kept = None

    def slave_record(self):
        return self.kept

    def keep_slave_record(self, doc, sync):
        self.kept = doc


def test_a_slave_that_left_is_kept_until_another_holds_everything_sent_to_it():
    st = State()
    r = SlaveRecord(st, "m")
    r.subscribed("s1")
    r.subscribed("s2")
    r.left("s1", 10, {"s2": 8})           # s2 lacks 9..10, which s1 may have acknowledged
    assert r.of_epoch(1) == {"s1", "s2"}
    r.acknowledged("s2", 9)
    assert r.of_epoch(1) == {"s1", "s2"}
    r.acknowledged("s2", 10)
    assert r.of_epoch(1) == {"s2"}
    assert SlaveRecord(st, "m").of_epoch(1) == {"s2"}   # as a restart reads it


def test_the_only_slave_is_never_forgotten_by_leaving():
    st = State()
    r = SlaveRecord(st, "m")
    r.subscribed("s1")
    r.left("s1", 10, {})
    assert SlaveRecord(st, "m").of_epoch(1) == {"s1"}


def test_a_slave_back_before_it_was_forgotten_is_not_forgotten_later():
    st = State()
    r = SlaveRecord(st, "m")
    r.subscribed("s1")
    r.subscribed("s2")
    r.left("s1", 10, {"s2": 5})
    r.subscribed("s1")
    r.acknowledged("s2", 50)
    assert r.of_epoch(1) == {"s1", "s2"}


def test_the_record_is_a_masters_own_at_its_epoch():
    st = State()
    SlaveRecord(st, "m").subscribed("s1")
    assert st.kept is not None
    assert SlaveRecord(st, "s1").of_epoch(1) == set()     # a copy of the store (a seed, a backup) is not its master
    assert SlaveRecord(st, "m").of_epoch(2) == set()      # a new epoch starts with no record
    st.epoch = 2
    r = SlaveRecord(st, "m")
    r.subscribed("s3")
    assert r.of_epoch(2) == {"s3"}


def test_forget_is_for_a_recorded_slave():
    st = State()
    r = SlaveRecord(st, "m")
    r.subscribed("s1")
    assert not r.forget("s9")
    assert r.forget("s1") and SlaveRecord(st, "m").of_epoch(1) == set()
