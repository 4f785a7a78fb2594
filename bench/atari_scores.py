"""The published Atari figures the suites compare with: the PPO scores at 40M frames for the games
CleanRL's docs tabulate (https://docs.cleanrl.dev/rl-algorithms/ppo/), and the random and human scores of the 57 games, from which the
human-normalised score comes. Games are named as in their gymnasium ids (BreakoutNoFrameskip-v4 ->
Breakout)."""

# Mean of the last 100 training games at 40M frames under the standard protocol: OpenAI baselines'
# PPO and CleanRL's PPO, as CleanRL's docs tabulate them.
PPO_40M = {  # game: (baselines PPO, CleanRL PPO)
    "Breakout": (388.9, 431.8),
    "BeamRider": (2740.0, 2447.8),
    "Qbert": (14283.4, 16430.7),
    "Seaquest": (1754.4, 1230.0),
    "SpaceInvaders": (1017.7, 1162.2),
    "Pong": (20.4, 20.3),
}

# Random and human scores of the DQN papers (human: a professional game tester), as DeepMind's DQN
# Zoo lists them for the 57 games (dqn_zoo/atari_data.py); ale-py's other ROMs (Adventure, AirRaid,
# Carnival, ElevatorAction, JourneyEscape, Pooyan) have none, so no human-normalised score.
RANDOM_HUMAN = {  # game: (random, human)
    "Alien": (227.8, 7127.7), "Amidar": (5.8, 1719.5), "Assault": (222.4, 742.0), "Asterix": (210.0, 8503.3),
    "Asteroids": (719.1, 47388.7), "Atlantis": (12850.0, 29028.1), "BankHeist": (14.2, 753.1),
    "BattleZone": (2360.0, 37187.5), "BeamRider": (363.9, 16926.5), "Berzerk": (123.7, 2630.4),
    "Bowling": (23.1, 160.7), "Boxing": (0.1, 12.1), "Breakout": (1.7, 30.5), "Centipede": (2090.9, 12017.0),
    "ChopperCommand": (811.0, 7387.8), "CrazyClimber": (10780.5, 35829.4), "Defender": (2874.5, 18688.9),
    "DemonAttack": (152.1, 1971.0), "DoubleDunk": (-18.6, -16.4), "Enduro": (0.0, 860.5),
    "FishingDerby": (-91.7, -38.7), "Freeway": (0.0, 29.6), "Frostbite": (65.2, 4334.7), "Gopher": (257.6, 2412.5),
    "Gravitar": (173.0, 3351.4), "Hero": (1027.0, 30826.4), "IceHockey": (-11.2, 0.9), "Jamesbond": (29.0, 302.8),
    "Kangaroo": (52.0, 3035.0), "Krull": (1598.0, 2665.5), "KungFuMaster": (258.5, 22736.3),
    "MontezumaRevenge": (0.0, 4753.3), "MsPacman": (307.3, 6951.6), "NameThisGame": (2292.3, 8049.0),
    "Phoenix": (761.4, 7242.6), "Pitfall": (-229.4, 6463.7), "Pong": (-20.7, 14.6), "PrivateEye": (24.9, 69571.3),
    "Qbert": (163.9, 13455.0), "Riverraid": (1338.5, 17118.0), "RoadRunner": (11.5, 7845.0), "Robotank": (2.2, 11.9),
    "Seaquest": (68.4, 42054.7), "Skiing": (-17098.1, -4336.9), "Solaris": (1236.3, 12326.7),
    "SpaceInvaders": (148.0, 1668.7), "StarGunner": (664.0, 10250.0), "Surround": (-10.0, 6.5),
    "Tennis": (-23.8, -8.3), "TimePilot": (3568.0, 5229.2), "Tutankham": (11.4, 167.6), "UpNDown": (533.4, 11693.2),
    "Venture": (0.0, 1187.5), "VideoPinball": (16256.9, 17667.9), "WizardOfWor": (563.5, 4756.5),
    "YarsRevenge": (3092.9, 54576.9), "Zaxxon": (32.5, 9173.3),
}


def published(game):
    """(baselines PPO, CleanRL PPO) at 40M frames, None for each one not published."""
    return PPO_40M.get(game, (None, None))


def human_normalised(game, score):
    """(score - random) / (human - random); None for a game without random and human scores."""
    if game not in RANDOM_HUMAN or score is None:
        return None
    rnd, human = RANDOM_HUMAN[game]
    return (score - rnd) / (human - rnd)
