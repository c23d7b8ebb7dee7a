from tvjax.cli import main

main()
