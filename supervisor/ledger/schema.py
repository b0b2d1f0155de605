"""Ledger schema migrations, versioned with ``PRAGMA user_version``.

Append a new entry to ``MIGRATIONS`` for every change; never edit a shipped one.

The file is past 600 lines but holds one job: the ordered list of shipped
migrations, which is read top to bottom as the schema's history. Split by feature,
the order (which is the version number) would have to be kept across files.
"""

from __future__ import annotations

MIGRATIONS: list[str] = [
    # 1: the actor substrate
    """
    CREATE TABLE boots (
        boot_id     TEXT PRIMARY KEY,
        seq         INTEGER NOT NULL UNIQUE,
        pid         INTEGER NOT NULL,
        protocol    INTEGER NOT NULL,
        started_at  REAL NOT NULL,
        ended_at    REAL,
        end_reason  TEXT
    );
    CREATE TABLE groups (
        group_id    TEXT PRIMARY KEY,
        strategy    TEXT NOT NULL,
        status      TEXT NOT NULL,
        reason      TEXT,
        boot_id     TEXT NOT NULL,
        updated_at  REAL NOT NULL
    );
    CREATE TABLE actors (
        actor_id     TEXT PRIMARY KEY,
        group_id     TEXT NOT NULL,
        template     TEXT NOT NULL,
        spec_json    TEXT NOT NULL,
        status       TEXT NOT NULL,
        restarts     INTEGER NOT NULL DEFAULT 0,
        incarnation  INTEGER NOT NULL DEFAULT 0,
        pid          INTEGER,
        last_exit    INTEGER,
        last_exit_at REAL,
        boot_id      TEXT NOT NULL,
        updated_at   REAL NOT NULL
    );
    CREATE TABLE events (
        cursor   INTEGER PRIMARY KEY AUTOINCREMENT,
        at       REAL NOT NULL,
        boot_id  TEXT NOT NULL,
        kind     TEXT NOT NULL,
        subject  TEXT NOT NULL,
        data     TEXT NOT NULL
    );
    CREATE TRIGGER events_append_only_u BEFORE UPDATE ON events
        BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
    CREATE TRIGGER events_append_only_d BEFORE DELETE ON events
        BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
    """,
]

MIGRATIONS.append(
    # 2: durable runs and actions
    """
    CREATE TABLE runs (
        run_id          TEXT PRIMARY KEY,
        agent_id        TEXT NOT NULL,
        session_id      TEXT NOT NULL,
        kind            TEXT NOT NULL,
        parent_run_id   TEXT,
        root_run_id     TEXT NOT NULL,
        depth           INTEGER NOT NULL DEFAULT 0,
        task            TEXT NOT NULL,
        status          TEXT NOT NULL,
        reason          TEXT,
        loop_index      INTEGER NOT NULL DEFAULT 0,
        provider        TEXT NOT NULL,
        provider_config TEXT NOT NULL,
        options         TEXT NOT NULL DEFAULT '{}',
        repairs         TEXT NOT NULL DEFAULT '{}',
        created_at      REAL NOT NULL,
        updated_at      REAL NOT NULL,
        started_at      REAL,
        ended_at        REAL
    );
    CREATE INDEX runs_by_agent ON runs (agent_id, status, created_at);
    CREATE TABLE plans (
        run_id      TEXT NOT NULL,
        loop_index  INTEGER NOT NULL,
        plan        TEXT NOT NULL,
        created_at  REAL NOT NULL,
        PRIMARY KEY (run_id, loop_index)
    );
    CREATE TABLE provider_requests (
        slot         TEXT PRIMARY KEY,
        run_id       TEXT NOT NULL,
        loop_index   INTEGER NOT NULL,
        attempt      INTEGER NOT NULL,
        status       TEXT NOT NULL,
        error_kind   TEXT,
        error        TEXT,
        response     TEXT,
        retry_at     REAL,
        consumed     INTEGER NOT NULL DEFAULT 0,
        boot_id      TEXT NOT NULL,
        started_at   REAL NOT NULL,
        finished_at  REAL
    );
    CREATE INDEX provider_requests_by_run ON provider_requests (run_id, loop_index, attempt);
    CREATE TABLE actions (
        action_id     TEXT PRIMARY KEY,
        run_id        TEXT NOT NULL,
        agent_id      TEXT NOT NULL,
        loop_index    INTEGER NOT NULL,
        action_index  INTEGER NOT NULL,
        tool          TEXT NOT NULL,
        input         TEXT NOT NULL,
        fingerprint   TEXT NOT NULL,
        phase         TEXT NOT NULL,
        rerunnable    INTEGER NOT NULL,
        policy        TEXT NOT NULL,
        attempts      INTEGER NOT NULL DEFAULT 0,
        result        TEXT,
        error         TEXT,
        reason        TEXT,
        boot_id       TEXT NOT NULL,
        created_at    REAL NOT NULL,
        updated_at    REAL NOT NULL,
        executing_at  REAL,
        finished_at   REAL,
        UNIQUE (run_id, loop_index, action_index)
    );
    CREATE TABLE receipts (
        receipt_id      INTEGER PRIMARY KEY AUTOINCREMENT,
        action_id       TEXT NOT NULL UNIQUE,
        run_id          TEXT NOT NULL,
        agent_id        TEXT NOT NULL,
        fingerprint     TEXT NOT NULL,
        tool            TEXT NOT NULL,
        status          TEXT NOT NULL,
        input_summary   TEXT NOT NULL,
        result_summary  TEXT NOT NULL,
        note            TEXT,
        started_at      REAL,
        finished_at     REAL,
        created_at      REAL NOT NULL
    );
    CREATE TABLE observations (
        run_id      TEXT NOT NULL,
        seq         INTEGER NOT NULL,
        source      TEXT NOT NULL UNIQUE,
        loop_index  INTEGER NOT NULL,
        data        TEXT NOT NULL,
        created_at  REAL NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    CREATE TABLE finalizations (
        run_id      TEXT PRIMARY KEY,
        phase       TEXT NOT NULL,
        reply       TEXT NOT NULL,
        created_at  REAL NOT NULL,
        updated_at  REAL NOT NULL
    );
    CREATE TABLE replies (
        reply_id    INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id      TEXT NOT NULL UNIQUE,
        text        TEXT NOT NULL,
        created_at  REAL NOT NULL
    );
    CREATE TRIGGER receipts_append_only BEFORE DELETE ON receipts
        BEGIN SELECT RAISE(ABORT, 'receipts are append-only'); END;
    CREATE TRIGGER replies_append_only BEFORE DELETE ON replies
        BEGIN SELECT RAISE(ABORT, 'replies are append-only'); END;
    """
)

MIGRATIONS.append(
    # 3: swarm collaboration: isolated children, joins, claims, delegation
    """
    CREATE TABLE isolated_groups (
        group_id          TEXT PRIMARY KEY,
        parent_run_id     TEXT NOT NULL,
        parent_action_id  TEXT NOT NULL UNIQUE,
        join_mode         TEXT NOT NULL,
        request_digest    TEXT NOT NULL,
        status            TEXT NOT NULL,
        created_at        REAL NOT NULL,
        joined_at         REAL
    );
    CREATE TABLE children (
        delegation_id        TEXT PRIMARY KEY,
        group_id             TEXT NOT NULL,
        idx                  INTEGER NOT NULL,
        instance_id          TEXT NOT NULL UNIQUE,
        template             TEXT NOT NULL,
        task                 TEXT NOT NULL,
        acceptance_criteria  TEXT NOT NULL,
        expected_artifacts   TEXT NOT NULL,
        write_scopes         TEXT NOT NULL,
        run_id               TEXT NOT NULL UNIQUE,
        status               TEXT NOT NULL,
        result               TEXT,
        created_at           REAL NOT NULL,
        ended_at             REAL,
        UNIQUE (group_id, idx)
    );
    CREATE TABLE delegations (
        delegation_id        TEXT PRIMARY KEY,
        parent_run_id        TEXT NOT NULL,
        parent_action_id     TEXT NOT NULL UNIQUE,
        target_agent         TEXT NOT NULL,
        task                 TEXT NOT NULL,
        acceptance_criteria  TEXT NOT NULL,
        expected_artifacts   TEXT NOT NULL,
        repair_of            TEXT UNIQUE,
        run_id               TEXT NOT NULL UNIQUE,
        status               TEXT NOT NULL,
        result               TEXT,
        created_at           REAL NOT NULL,
        ended_at             REAL
    );
    CREATE TABLE deliveries (
        delivery_id           TEXT PRIMARY KEY,
        kind                  TEXT NOT NULL,
        source_id             TEXT NOT NULL UNIQUE,
        target                TEXT NOT NULL,
        parent_run_id         TEXT NOT NULL,
        status                TEXT NOT NULL,
        claimed_by_action_id  TEXT,
        claim_id              TEXT,
        payload               TEXT NOT NULL,
        created_at            REAL NOT NULL,
        claimed_at            REAL
    );
    CREATE TABLE claim_journal (
        claim_id       TEXT PRIMARY KEY,
        parent_run_id  TEXT NOT NULL,
        action_id      TEXT NOT NULL UNIQUE,
        delivery_ids   TEXT NOT NULL,
        phase          TEXT NOT NULL,
        created_at     REAL NOT NULL,
        updated_at     REAL NOT NULL
    );
    CREATE TRIGGER deliveries_claim_one_way BEFORE UPDATE OF status ON deliveries
        WHEN OLD.status != 'dispatched'
        BEGIN SELECT RAISE(ABORT, 'a delivery leaves dispatched once, one way'); END;
    """
)

MIGRATIONS.append(
    # 4: process sessions
    """
    CREATE TABLE sessions (
        process_id        TEXT PRIMARY KEY,
        run_id            TEXT NOT NULL,
        agent_id          TEXT NOT NULL,
        start_action_id   TEXT NOT NULL UNIQUE,
        actor_id          TEXT NOT NULL,
        program           TEXT NOT NULL,
        argv_summary      TEXT NOT NULL,
        cwd               TEXT NOT NULL,
        state             TEXT NOT NULL,
        launch_mode       TEXT,
        exit_code         INTEGER,
        reason            TEXT,
        output_bytes      INTEGER NOT NULL DEFAULT 0,
        stdin_bytes       INTEGER NOT NULL DEFAULT 0,
        boot_id           TEXT NOT NULL,
        created_at        REAL NOT NULL,
        updated_at        REAL NOT NULL
    );
    CREATE INDEX sessions_by_run ON sessions (run_id, state);
    CREATE TABLE command_launches (
        action_id     TEXT PRIMARY KEY,
        launch_mode   TEXT NOT NULL,
        exit_code     INTEGER,
        transcript    TEXT,
        created_at    REAL NOT NULL
    );
    """
)

MIGRATIONS.append(
    # 5: process sessions: a person's reconciliation verdict (needs-reconciliation is
    # terminal in the session state machine, so the verdict is kept beside the state)
    # and a machine-readable failure code (e.g. sandbox-unavailable).
    """
    ALTER TABLE sessions ADD COLUMN error_code TEXT;
    ALTER TABLE sessions ADD COLUMN resolution TEXT;
    ALTER TABLE sessions ADD COLUMN resolution_note TEXT;
    ALTER TABLE sessions ADD COLUMN resolved_at REAL;
    """
)


MIGRATIONS.append(
    # 6: raw copies (supervisor/runs/sealed_input.py): where redaction changed a response,
    # a plan or an action input, the row keeps the redacted copy and the sha256 of
    # the raw one, which waits in the private spool for the agent.
    """
    ALTER TABLE provider_requests ADD COLUMN raw_sha256 TEXT;
    ALTER TABLE plans ADD COLUMN raw_sha256 TEXT;
    ALTER TABLE actions ADD COLUMN raw_sha256 TEXT;
    """
)

MIGRATIONS.append(
    # 7: MCP catalogs pinned per run (supervisor/mcp/mcp_catalog.py): a tool whose schema
    # changed since the pin fails closed.
    """
    CREATE TABLE mcp_pins (
        run_id      TEXT NOT NULL,
        server      TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        tools       TEXT NOT NULL,
        pinned_at   REAL NOT NULL,
        PRIMARY KEY (run_id, server)
    );
    """
)

MIGRATIONS.append(
    # 8: interactive runs (supervisor/interactive/interactive_store.py): steers applied once at a safe
    # boundary, questions to the user answered once, and conversations (chat
    # sessions) whose runs share one history, forkable.
    """
    CREATE TABLE steers (
        steer_id     TEXT PRIMARY KEY,
        run_id       TEXT NOT NULL,
        text         TEXT NOT NULL,
        created_at   REAL NOT NULL,
        applied_loop INTEGER,
        applied_at   REAL
    );
    CREATE INDEX steers_pending ON steers (run_id, applied_at);
    CREATE TABLE input_requests (
        action_id    TEXT PRIMARY KEY,
        run_id       TEXT NOT NULL,
        question     TEXT NOT NULL,
        options      TEXT NOT NULL,
        created_at   REAL NOT NULL,
        answer       TEXT,
        answered_at  REAL
    );
    CREATE TABLE conversations (
        conversation_id TEXT PRIMARY KEY,
        agent_id        TEXT NOT NULL,
        forked_from     TEXT,
        fork_turns      INTEGER NOT NULL DEFAULT 0,
        created_at      REAL NOT NULL
    );
    ALTER TABLE runs ADD COLUMN conversation_id TEXT;
    CREATE INDEX runs_by_conversation ON runs (conversation_id, created_at);
    """
)

MIGRATIONS.append(
    # 9: intent contracts (supervisor/intent/intent_contract.py): versions kept once, the
    # guard's decision receipts, and contract updates applied at a safe boundary.
    """
    CREATE TABLE intent_contracts (
        contract_ref     TEXT NOT NULL,
        contract_version INTEGER NOT NULL,
        snapshot_sha256  TEXT NOT NULL,
        projection       TEXT NOT NULL,
        source           TEXT NOT NULL,
        created_at       REAL NOT NULL,
        PRIMARY KEY (contract_ref, contract_version)
    );
    CREATE TABLE intent_receipts (
        receipt_id  TEXT PRIMARY KEY,
        run_id      TEXT NOT NULL,
        event_ref   TEXT NOT NULL,
        data        TEXT NOT NULL,
        created_at  REAL NOT NULL
    );
    CREATE INDEX intent_receipts_by_run ON intent_receipts (run_id, created_at);
    CREATE TABLE intent_updates (
        update_id        TEXT PRIMARY KEY,
        run_id           TEXT NOT NULL,
        contract_ref     TEXT NOT NULL,
        contract_version INTEGER NOT NULL,
        created_at       REAL NOT NULL,
        applied_at       REAL
    );
    """
)

MIGRATIONS.append(
    # 10: jobs taken from an agent-task bridge (supervisor/bridge/bridge_service.py): each
    # phase is committed before the bridge call it leads to, with the idempotency
    # key and the exact parameters, so a retry after a crash is the same call.
    """
    CREATE TABLE bridge_jobs (
        job_id          TEXT PRIMARY KEY,
        task_id         TEXT NOT NULL,
        title           TEXT NOT NULL,
        phase           TEXT NOT NULL,
        revision        INTEGER NOT NULL DEFAULT 0,
        binding_id      TEXT,
        assignment_id   TEXT,
        bridge_run_id   TEXT,
        run_id          TEXT,
        reply           TEXT,
        submission_id   TEXT,
        reason          TEXT,
        created_at      REAL NOT NULL,
        updated_at      REAL NOT NULL
    );
    CREATE INDEX bridge_jobs_by_phase ON bridge_jobs (phase, created_at);
    """
)

MIGRATIONS.append(
    # 11: a run's durable plan (supervisor/longtask/plan_store.py) and its updates, once each
    # per action id.
    """
    CREATE TABLE run_plans (
        run_id     TEXT PRIMARY KEY,
        revision   INTEGER NOT NULL,
        steps      TEXT NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE plan_updates (
        action_id  TEXT PRIMARY KEY,
        run_id     TEXT NOT NULL,
        revision   INTEGER NOT NULL,
        result     TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    """
)

MIGRATIONS.append(
    # 12: goal mode (supervisor/longtask/goal_store.py): the model's verdicts on its goal,
    # once each per action id.
    """
    CREATE TABLE goal_verdicts (
        action_id  TEXT PRIMARY KEY,
        run_id     TEXT NOT NULL,
        met        INTEGER NOT NULL,
        evidence   TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE INDEX goal_verdicts_by_run ON goal_verdicts (run_id, created_at);
    """
)

MIGRATIONS.append(
    # 13: context compaction (supervisor/longtask/compaction.py): model-written summaries
    # of a run's older observations, each with the range it covers, and the
    # compactions people asked for (corral compact).
    """
    CREATE TABLE compactions (
        run_id        TEXT NOT NULL,
        from_seq      INTEGER NOT NULL,
        to_seq        INTEGER NOT NULL,
        summary       TEXT NOT NULL,
        tokens_before INTEGER NOT NULL,
        tokens_after  INTEGER NOT NULL,
        created_at    REAL NOT NULL,
        PRIMARY KEY (run_id, to_seq)
    );
    CREATE TABLE compaction_requests (
        run_id     TEXT PRIMARY KEY,
        created_at REAL NOT NULL
    );
    """
)

MIGRATIONS.append(
    # 14: the collaboration policy a root run is bound to by its first valid wave
    # (supervisor/context/collaboration_service.py): a snapshot, its digest, and when.
    """
    CREATE TABLE collaboration_bindings (
        run_id     TEXT PRIMARY KEY,
        policy     TEXT NOT NULL,
        digest     TEXT NOT NULL,
        loop_index INTEGER NOT NULL,
        bound_at   REAL NOT NULL
    );
    """
)

MIGRATIONS.append(
    # 15: indexes for what the steps of a run ask about that run (supervisor/
    # runs/next_step.py: its open children and delegations, its pending
    # intent updates; a parent's deliveries and claims; a run's open questions).
    # Without them each such step scanned the table whole, so a swarm's steps
    # slowed down as its history grew.
    """
    CREATE INDEX isolated_groups_by_parent ON isolated_groups (parent_run_id, status);
    CREATE INDEX delegations_by_parent ON delegations (parent_run_id, status);
    CREATE INDEX intent_updates_pending ON intent_updates (run_id, applied_at, contract_version);
    CREATE INDEX deliveries_by_parent ON deliveries (parent_run_id, status);
    CREATE INDEX claim_journal_by_parent ON claim_journal (parent_run_id, phase);
    CREATE INDEX input_requests_by_run ON input_requests (run_id);
    """
)

MIGRATIONS.append(
    # 16: crashes of an agent while it ran an action (supervisor/runs/poison.py): one row
    # per crashed incarnation, so that an action that keeps crashing its agent is
    # stopped as poison (and `corral show` says why), across restarts and boots.
    """
    CREATE TABLE action_crashes (
        action_id   TEXT NOT NULL,
        actor_id    TEXT NOT NULL,
        boot_id     TEXT NOT NULL,
        incarnation INTEGER NOT NULL,
        exit_code   INTEGER NOT NULL,
        at          REAL NOT NULL,
        PRIMARY KEY (action_id, boot_id, actor_id, incarnation)
    );
    """
)

MIGRATIONS.append(
    # 17: transcripts (supervisor/runs/transcript_store.py, docs/transcripts.md): each
    # provider turn names the system prompt and the tool catalog it was sent (by the
    # sha256 of their text, kept once in transcript_blobs, redacted) and how many of
    # the run's observations it had seen (the history itself is not copied).
    """
    ALTER TABLE provider_requests ADD COLUMN system_sha256 TEXT;
    ALTER TABLE provider_requests ADD COLUMN catalog_sha256 TEXT;
    ALTER TABLE provider_requests ADD COLUMN history_seq INTEGER;
    CREATE TABLE transcript_blobs (
        sha256     TEXT PRIMARY KEY,
        kind       TEXT NOT NULL,
        text       TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    """
)

MIGRATIONS.append(
    # The project revision and its verifications (supervisor/project/): one row per
    # committed write that changed sources (the revision is its number), and one per
    # project.verify action, bound to the revision and the source fingerprint it ran on.
    """
    CREATE TABLE project_revisions (
        revision    INTEGER PRIMARY KEY,
        action_id   TEXT NOT NULL UNIQUE,
        run_id      TEXT NOT NULL,
        root_run_id TEXT NOT NULL,
        tool        TEXT NOT NULL,
        created_at  REAL NOT NULL
    );
    CREATE INDEX project_revisions_by_root ON project_revisions (root_run_id);
    CREATE TABLE project_verifications (
        action_id   TEXT PRIMARY KEY,
        run_id      TEXT NOT NULL,
        revision    INTEGER NOT NULL,
        fingerprint TEXT NOT NULL,
        status      TEXT NOT NULL,
        commands    INTEGER NOT NULL,
        output      TEXT NOT NULL,
        created_at  REAL NOT NULL
    );
    CREATE INDEX project_verifications_by_revision ON project_verifications (revision, status);
    """
)

MIGRATIONS.append(
    # Structured questions (V1.23, supervisor/interactive/question_store.py): the request
    # id derived from the action, the questions as JSON, and the answer's caller response
    # id with the answers by question id; one request per id.
    """
    ALTER TABLE input_requests ADD COLUMN request_id TEXT;
    ALTER TABLE input_requests ADD COLUMN questions TEXT;
    ALTER TABLE input_requests ADD COLUMN response_id TEXT;
    ALTER TABLE input_requests ADD COLUMN answers TEXT;
    CREATE UNIQUE INDEX input_requests_by_request ON input_requests (request_id);
    """
)

MIGRATIONS.append(
    # The reasoning effort each provider turn asked for (seed 004 V1.2; set by the
    # turn's transcript notes, supervisor/runs/transcript_store.py). NULL: a provider
    # without one.
    """
    ALTER TABLE provider_requests ADD COLUMN reasoning_effort TEXT;
    """
)

MIGRATIONS.append(
    # Steer and goal control (seed 004 V1.13, V1.18): a steer's caller id is its
    # steer_id, its text's SHA-256 tells a retry from a conflict; a provider turn
    # interrupted by a steer or a pause is ``interrupted`` with provider_interrupted = 1
    # (never retried as a transient error); a goal has one lifecycle row
    # (supervisor/longtask/goal_lifecycle.py) with a revision that its verdicts bind to.
    """
    ALTER TABLE steers ADD COLUMN text_sha256 TEXT;
    ALTER TABLE steers ADD COLUMN text_bytes INTEGER;
    ALTER TABLE provider_requests ADD COLUMN provider_interrupted INTEGER NOT NULL DEFAULT 0;
    CREATE TABLE goals (
        goal_id         TEXT PRIMARY KEY,
        run_id          TEXT NOT NULL UNIQUE,
        conversation_id TEXT,
        text            TEXT NOT NULL,
        revision        INTEGER NOT NULL,
        status          TEXT NOT NULL,
        created_at      REAL NOT NULL,
        updated_at      REAL NOT NULL
    );
    CREATE INDEX goals_by_conversation ON goals (conversation_id, status);
    ALTER TABLE goal_verdicts ADD COLUMN goal_revision INTEGER;
    ALTER TABLE goal_verdicts ADD COLUMN plan_revision INTEGER;
    ALTER TABLE goal_verdicts ADD COLUMN verification_id TEXT;
    """
)

MIGRATIONS.append(
    # Provider-native web search (seed 004 V1.20): whether each provider turn let the
    # provider search (1) or not (0); NULL: a turn recorded before this, or not said.
    """
    ALTER TABLE provider_requests ADD COLUMN web_search INTEGER;
    """
)

MIGRATIONS.append(
    # A goal edit voids what was planned for the old goal (seed 004 V1.18): each action
    # is bound to its run's goal id and revision when prepared (NULL: no goal, or an
    # action from before this, which an edit treats as stale); a goal keeps its
    # constraints and verification lists (JSON arrays) and the completion evidence
    # the system wrote from the run's finalization, whose goal snapshot it binds.
    """
    ALTER TABLE actions ADD COLUMN goal_id TEXT;
    ALTER TABLE actions ADD COLUMN goal_revision INTEGER;
    ALTER TABLE goals ADD COLUMN constraints TEXT;
    ALTER TABLE goals ADD COLUMN verification TEXT;
    ALTER TABLE goals ADD COLUMN completion TEXT;
    ALTER TABLE finalizations ADD COLUMN goal_snapshot TEXT;
    """
)

MIGRATIONS.append(
    # The plan's explanation (seed 004 V1.17): each update says why, in bounded text;
    # NULL for a plan stored before.
    """
    ALTER TABLE run_plans ADD COLUMN explanation TEXT;
    """
)

MIGRATIONS.append(
    # A launch's sandbox in every record (seed 004 V1.11: the process record and the
    # command log keep sandboxMode, networkAccess, sandboxBackend and
    # sandboxProfileVersion), and the handshake's stages in the process record
    # (V1.11.1: sandboxEstablishment, targetExec, launchFailureKind, sandboxReadyAt,
    # execEstablishedAt). NULL for a record made before this.
    """
    ALTER TABLE sessions ADD COLUMN sandbox_mode TEXT;
    ALTER TABLE sessions ADD COLUMN network_access INTEGER;
    ALTER TABLE sessions ADD COLUMN sandbox_backend TEXT;
    ALTER TABLE sessions ADD COLUMN sandbox_profile_version INTEGER;
    ALTER TABLE sessions ADD COLUMN sandbox_establishment TEXT;
    ALTER TABLE sessions ADD COLUMN target_exec TEXT;
    ALTER TABLE sessions ADD COLUMN launch_failure_kind TEXT;
    ALTER TABLE sessions ADD COLUMN sandbox_ready_at REAL;
    ALTER TABLE sessions ADD COLUMN exec_established_at REAL;
    ALTER TABLE command_launches ADD COLUMN sandbox_mode TEXT;
    ALTER TABLE command_launches ADD COLUMN network_access INTEGER;
    ALTER TABLE command_launches ADD COLUMN sandbox_backend TEXT;
    ALTER TABLE command_launches ADD COLUMN sandbox_profile_version INTEGER;
    """
)

MIGRATIONS.append(
    # A root's collaboration batches as seed 004 V1.32's provider action batch v2: the
    # contract (policy snapshot, initial specialists, children per group, each
    # member's tool and fingerprint), its SHA-256, and an id that binds both. A
    # delegation or spawn takes effect only as a member of its loop's batch.
    """
    CREATE TABLE collaboration_batches (
        batch_id              TEXT PRIMARY KEY,
        run_id                TEXT NOT NULL,
        loop_index            INTEGER NOT NULL,
        version               INTEGER NOT NULL,
        policy_fingerprint    TEXT NOT NULL,
        contract_fingerprint  TEXT NOT NULL,
        contract              TEXT NOT NULL,
        created_at            REAL NOT NULL,
        UNIQUE (run_id, loop_index)
    );
    """
)

MIGRATIONS.append(
    # A steer's place in its run: a sequence the ledger hands out in the recording
    # transaction (seed 004 V1.13: "sequence 在项目写锁内从 ledger 单调递增，不能使用时间戳"), so a
    # wall clock set back cannot reorder a run's steers. Older rows get theirs from the
    # order they were applied in before (created_at, then steer_id).
    """
    ALTER TABLE steers ADD COLUMN seq INTEGER;
    UPDATE steers SET seq = (SELECT COUNT(*) FROM steers AS earlier WHERE earlier.run_id = steers.run_id
        AND (earlier.created_at < steers.created_at
             OR (earlier.created_at = steers.created_at AND earlier.steer_id <= steers.steer_id)));
    CREATE UNIQUE INDEX steers_sequence ON steers (run_id, seq);
    """
)

MIGRATIONS.append(
    # A structured question and its answer as messages of the owning conversation
    # (seed 004 V1.23: "问题消息使用稳定 messageId 幂等追加到 owning Agent Session"), each with
    # an id derived from its request, appended once in the ask's or the answer's
    # transaction. A run without a conversation keeps its own (conversation_id NULL).
    """
    CREATE TABLE conversation_messages (
        message_id       TEXT PRIMARY KEY,
        conversation_id  TEXT,
        run_id           TEXT NOT NULL,
        request_id       TEXT NOT NULL,
        role             TEXT NOT NULL,
        kind             TEXT NOT NULL,
        text             TEXT NOT NULL,
        created_at       REAL NOT NULL
    );
    CREATE INDEX conversation_messages_by_run ON conversation_messages (run_id);
    """
)

MIGRATIONS.append(
    # A failed provider request's identity (seed 004 V1.39, V1.40): one SHA-256 per
    # part of what it sent (supervisor/runs/retry_identity.py), kept beside its
    # durable retry and compared when the retry falls due. Digests only; NULL for a
    # request recorded before this, or one lost in a crash (no identity to compare).
    """
    ALTER TABLE provider_requests ADD COLUMN request_identity TEXT;
    """
)

MIGRATIONS.append(
    # What a provider request asks (seed 004 V1.21 "独立 requestKind=context-compaction"): a
    # loop's planning turn ('tool-plan', every row before this) or the summary of a run's
    # older turns ('context-compaction', supervisor/longtask/compaction_requests.py), which
    # shares the lifecycle, the durable retry and the orphan rule but is no turn of its loop.
    """
    ALTER TABLE provider_requests ADD COLUMN request_kind TEXT NOT NULL DEFAULT 'tool-plan';
    """
)
