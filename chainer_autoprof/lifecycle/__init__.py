"""The process lifecycle, composed by the agent: who profiles, and how a run ends.

Children and MPI ranks (:mod:`.processes`), the ways a program ends
(:mod:`.exit`), what is pulled from the recorder and reported at the end
(:mod:`.finish`) and the agent's own overhead (:mod:`.overhead`).  The agent
passes down what these need; nothing here looks the agent up.
"""
