from agentctx.cli import main

main()
