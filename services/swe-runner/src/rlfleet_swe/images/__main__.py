from rlfleet_swe.images import main

main()
