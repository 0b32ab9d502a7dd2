"""`python -m assay.agent` runs `assay-agent`."""

from assay.agent.main import main

main()
