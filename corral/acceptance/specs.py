"""The swarm specs the flows run: TOML text, with each agent's model table from the
provider the user chose (``provider.Provider``)."""

from __future__ import annotations

from corral.acceptance.provider import Provider

#: The coder's task: a read, then one exact edit as a changeset (it takes a checkpoint
#: first, seed 004 V1.1 §5.3) that waits for a person.
CODER_TASK = ("Read notes.txt with fs.read. Then call project.changeset with one change: path \"notes.txt\","
              " operation \"update\", old_text \"status: draft\", new_text \"status: final\". Then reply with one"
              " sentence saying what changed.")
NOTES_BEFORE = "status: draft\n"
NOTES_AFTER = "status: final\n"


def _agent(provider: Provider, agent_id: str, role: str, scopes: str, tools: str, calls: int,
           extra: str = "") -> str:
    """One ``[[agents]]`` table on the suite's provider, allowed ``calls`` provider calls."""
    return (f'[[agents]]\nid = "{agent_id}"\nrole = "{role}"\nwrite_scopes = [{scopes}]\ntools = [{tools}]\n'
            + extra + provider.agent_table("agents", calls))


def coder_spec(provider: Provider, project: str) -> str:
    """One agent: fs.read runs unattended, project.changeset waits for a person
    (confirm); the changeset's optional fields (operation, old_text, new_text) are offered."""
    return f"""name = "acceptance-coder"
[project]
root = "{project}"
[policy]
"fs.read" = "auto"
"project.changeset" = "confirm"
{provider.models_table()}
[[agents]]
id = "coder"
tools = ["fs.read", "project.changeset"]
max_provider_retries = 1
{provider.agent_table("agents", 2, optional_fields=True)}"""


SWARM_TASK = ("Ship the release notes. Delegate to researcher (write research/facts.md) and to reviewer"
              " (write review/check.md), spawn the writer template twice and the checker template once as an"
              " isolated group, wait with agent.run_status, then reply with one sentence.")


def swarm_spec(provider: Provider, project: str) -> str:
    """A supervisor, two specialists and two templates: two delegates and one isolated
    group of three children joined once (seed 004 V1.1 §5.6)."""
    def template(template_id: str) -> str:
        return f'[[templates]]\nid = "{template_id}"\ntools = ["fs.write"]\n' + provider.agent_table("templates", 1)

    return "\n".join([
        f'name = "acceptance-swarm"\n[project]\nroot = "{project}"\n[policy]\ndefault = "auto"\n'
        "[limits]\nmax_children_per_call = 3\nmax_depth = 1\n",
        provider.models_table(),
        _agent(provider, "project-supervisor", "root", '"summary"',
              '"agent.delegate", "agent.spawn_isolated", "agent.run_status"', 4),
        _agent(provider, "researcher", "specialist", '"research"', '"fs.write"', 1),
        _agent(provider, "reviewer", "specialist", '"review"', '"fs.write"', 1),
        template("writer"),
        template("checker"),
    ])


#: The preview's port: the task names it, as a person would.
PREVIEW_PORT = 8765
#: The order: the preview's process first, since starting a process is a change of
#: the project (seed 004 V1.11.1: a command moves the revision once its sandbox is
#: ready), so the verification comes after it, and the check after both.
VERIFY_TASK = ("First start the preview: process.start with program \"python3\" and args"
               f" [\"-m\", \"http.server\", \"{PREVIEW_PORT}\", \"--bind\", \"127.0.0.1\", \"--directory\", \"site\"]."
               " Then change the project: fs.write site/version.txt with the content \"2\". Then call"
               " project.verify. Then call preview.validate with no arguments (it finds the preview you started)."
               " Then stop the preview: process.terminate with its process_id. Then reply with one sentence.")


def verify_spec(provider: Provider, project: str) -> str:
    """A change (fs.write), then project.verify (a check script that passes only
    after that change) and preview.validate of a preview the agent
    starts as a process session; the dev server shares the host's network, where the
    browser runs."""
    return f"""name = "acceptance-verify"
[project]
root = "{project}"
verify = [["python3", "check.py"]]
[policy]
default = "auto"
[sandbox]
network = true
{provider.models_table()}
[[agents]]
id = "verifier"
tools = ["fs.write", "process.start", "process.terminate", "preview.validate", "project.verify"]
{provider.agent_table("agents", 4, optional_fields=True)}"""


#: The provider retry's backoff: long enough that the kill lands inside it.
RETRY_BACKOFF_S = 15.0
RETRY_TASK = ("Get the release facts written and reviewed. In one turn delegate to researcher (write"
              " research/facts.md) and to reviewer (write review/check.md). Collect both deliveries with"
              " agent.run_status. Read the weaker delivery's contract (agent.run_status with its delegation_id),"
              " send it back once as a repair (agent.delegate with repair_of), collect the repair with"
              " agent.run_status, then reply with one sentence.")


def retry_spec(provider: Provider, project: str) -> str:
    """A supervisor and two specialists on an OpenAI-compatible route (the fault
    proxy), each with one provider retry and a backoff long enough for the suite to
    kill the supervisor inside it; one repair per delivery (seed 004 V1.29, V1.42)."""
    retries = f"max_provider_retries = 1\nretry_base_s = {RETRY_BACKOFF_S}\nretry_cap_s = {RETRY_BACKOFF_S}\n"
    return "\n".join([
        f'name = "acceptance-retry"\n[project]\nroot = "{project}"\n[policy]\ndefault = "auto"\n'
        "[limits]\nmax_repairs_per_delivery = 1\n",
        _agent(provider, "project-supervisor", "root", '"summary"', '"agent.delegate", "agent.run_status"', 6, retries),
        _agent(provider, "researcher", "specialist", '"research"', '"fs.write"', 1, retries),
        _agent(provider, "reviewer", "specialist", '"review"', '"fs.write"', 1, retries),
    ])


#: Business terms only (seed 004 V1.30): no agent id, count, tool or repair recipe.
CHAT_TASK = ("Get this project ready for its first players: the release facts written down, a quality review of"
             " them, and an independent quick check. Report what was delivered, what was verified and the risks.")


def chat_spec(provider: Provider, project: str) -> str:
    """The supervisor the chat talks to, two specialists and one template: whether it
    delegates, spawns or repairs is its own choice (seed 004 V1.30, V1.31). Delegating
    and spawning wait for a person's approval (V1.31's approval batch)."""
    return "\n".join([
        f'name = "acceptance-chat"\n[project]\nroot = "{project}"\n[policy]\ndefault = "auto"\n'
        '"agent.delegate" = "confirm"\n"agent.spawn_isolated" = "confirm"\n'
        "[limits]\nmax_children_per_call = 3\nmax_depth = 1\nmax_repairs_per_delivery = 1\n",
        provider.models_table(),
        _agent(provider, "project-supervisor", "root", '"summary"',
              '"agent.delegate", "agent.spawn_isolated", "agent.run_status"', 5),
        _agent(provider, "researcher", "specialist", '"research"', '"fs.write"', 1),
        _agent(provider, "reviewer", "specialist", '"review"', '"fs.read", "fs.write"', 2),
        '[[templates]]\nid = "checker"\ntools = ["fs.write"]\n' + provider.agent_table("templates", 1),
    ])
