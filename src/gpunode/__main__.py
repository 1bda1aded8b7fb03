from gpunode.cli import main

main()
